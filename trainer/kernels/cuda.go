//go:build cuda

package kernels

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// CUDA is the GPU backend (-tags cuda): tensors in device memory, matrix
// products by cuBLAS (float32, or bfloat16 tensor cores with float32 sums:
// WithPrecision), everything else by the CUDA C kernels of cudaSource,
// compiled at run time by NVRTC and launched through the CUDA driver API
// (gorgonia.org/cu). Nothing crosses to the host but what Upload and
// Download move and the small per-call inputs (token ids, targets, the
// rotary table).
//
// Threading: a CUDA context is current per OS thread, so each CUDA value owns
// one goroutine locked to its OS thread (runtime.LockOSThread), on which the
// device's primary context is made current once and every driver, NVRTC and
// cuBLAS call is made. Methods send their work to that goroutine over a
// channel, so a CUDA value is safe for concurrent use; calls run one at a
// time, in arrival order. Kernel launches and products do not wait for the
// worker (the channel is buffered and the GPU queues them anyway): the host
// runs ahead, and only Alloc, Free, Download and Upload wait. The CUDA state
// (context, cuBLAS handle, module, scratch buffers) is touched only by that
// goroutine.
//
// Failures of the device (and misuse that the Go backend would answer with an
// index-out-of-range panic) panic, since the interface has no error returns:
// at once for misuse, and for a failure on the worker at the next call that
// waits for it, naming the operation that failed.
type CUDA struct {
	*cudaShared
	compute   cublasCompute
	precision Precision
}

// cudaShared is what the views of one device (WithPrecision) share.
type cudaShared struct {
	jobs   chan cudaJob
	mu     sync.RWMutex // held for reading while sending on jobs, for writing by Close
	closed bool
	device string
}

var _ Backend = (*CUDA)(nil)

type cudaJob struct {
	op   string
	fn   func(*cudaCall)
	done chan error // nil: nobody waits
}

// NewCUDA opens device 0 (the first of CUDA_VISIBLE_DEVICES), compiles the
// kernels for it with NVRTC and creates a cuBLAS handle.
func NewCUDA() (*CUDA, error) {
	jobs := make(chan cudaJob, 1024)
	ready := make(chan error, 1)
	var device string
	go func() {
		// Never unlocked: this goroutine owns the thread and the context
		// current on it for its whole life; when it returns still locked,
		// the runtime ends the thread.
		runtime.LockOSThread()
		drv, err := openCUDADriver(0)
		if err != nil {
			ready <- err
			return
		}
		device = drv.describe()
		ready <- nil
		w := &cudaWorker{drv: drv, rope: map[ropeKey]devPtr{}}
		for j := range jobs {
			w.run(j.op, j.fn)
			// A queued job's failure waits for the next job that
			// someone waits for.
			if j.done != nil {
				j.done <- w.err
				w.err = nil
			}
		}
		w.release()
	}()
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("kernels: opening the CUDA backend: %w", err)
	}
	return &CUDA{cudaShared: &cudaShared{jobs: jobs, device: device}, compute: computeFP32, precision: FP32}, nil
}

var (
	cudaDefaultOnce sync.Once
	cudaDefault     *CUDA
	cudaDefaultErr  error
)

// defaultBackend opens the GPU on first use. The cuda build has no CPU
// fallback: without a usable GPU it panics, naming the problem.
func defaultBackend() Backend {
	cudaDefaultOnce.Do(func() { cudaDefault, cudaDefaultErr = NewCUDA() })
	if cudaDefaultErr != nil {
		panic(fmt.Sprintf("%v (this binary was built with -tags cuda and needs a working NVIDIA GPU, driver, cuBLAS and NVRTC)", cudaDefaultErr))
	}
	return cudaDefault
}

// Name implements Backend.
func (*CUDA) Name() string { return "cuda" }

// Device describes the GPU and the PTX target the kernels were compiled for.
func (c *CUDA) Device() string { return c.device }

// Close frees the scratch memory, the cuBLAS handle and the module, releases
// the context and ends the worker goroutine (tensors not yet freed go with
// the context). Calls after Close panic.
func (c *cudaShared) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.jobs)
	}
	return nil
}

// run executes fn on the worker goroutine, waits for it, and panics with the
// error of the first operation that failed since the last wait (this one
// or one queued before it).
func (c *cudaShared) run(op string, fn func(*cudaCall)) {
	done := make(chan error, 1)
	c.send(cudaJob{op: op, fn: fn, done: done})
	if err := <-done; err != nil {
		panic(fmt.Sprintf("kernels: cuda %v", err))
	}
}

// queue sends fn to the worker without waiting; a failure is reported by the
// next run.
func (c *cudaShared) queue(op string, fn func(*cudaCall)) { c.send(cudaJob{op: op, fn: fn}) }

func (c *cudaShared) send(j cudaJob) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		panic("kernels: cuda " + j.op + " called after Close")
	}
	c.jobs <- j
}

// cudaSlots is the number of cached scratch buffers: the most small
// host inputs (ids, targets) one call moves.
const cudaSlots = 2

type cudaBuf struct {
	ptr  devPtr
	size int64
}

type ropeKey struct {
	t, hd int
	theta float32
}

// cudaWorker is the state owned by the worker goroutine.
type cudaWorker struct {
	drv  *cudaDriver
	bufs [cudaSlots]cudaBuf
	rope map[ropeKey]devPtr // rotary cos/sin tables, made once per shape
	err  error              // the first failure since the last wait
}

// run runs fn unless an earlier job failed since the last wait (then what
// it would do may depend on what failed), keeping the first failure in err.
func (w *cudaWorker) run(op string, fn func(*cudaCall)) {
	if w.err != nil {
		return
	}
	call := &cudaCall{w: w}
	func() {
		defer func() {
			if r := recover(); r != nil {
				call.err = fmt.Errorf("panic on the CUDA worker: %v", r)
			}
		}()
		fn(call)
	}()
	if call.err != nil {
		w.err = fmt.Errorf("%s: %w", op, call.err)
	}
}

func (w *cudaWorker) release() {
	for i := range w.bufs {
		if w.bufs[i].size > 0 {
			_ = w.drv.free(w.bufs[i].ptr)
			w.bufs[i] = cudaBuf{}
		}
	}
	for _, p := range w.rope {
		_ = w.drv.free(p)
	}
	w.drv.close()
}

// cudaCall is one method call on the worker. Its helpers do nothing once a
// step has failed, so a method body reads as straight-line code and the first
// error is what run reports.
type cudaCall struct {
	w   *cudaWorker
	err error
}

func (x *cudaCall) fail(what string, err error) {
	if err != nil && x.err == nil {
		x.err = fmt.Errorf("%s: %w", what, err)
	}
}

// buf returns slot's scratch buffer, grown to at least bytes.
func (x *cudaCall) buf(slot int, bytes int64) devPtr {
	if x.err != nil {
		return 0
	}
	b := &x.w.bufs[slot]
	if b.size >= bytes && b.size > 0 {
		return b.ptr
	}
	old := b.size
	if old > 0 {
		x.fail("freeing device memory", x.w.drv.free(b.ptr))
		*b = cudaBuf{}
		if x.err != nil {
			return 0
		}
	}
	size := max(bytes, old+old/2, 4096)
	size = (size + 4095) &^ 4095
	p, err := x.w.drv.alloc(size)
	if err != nil {
		x.fail(fmt.Sprintf("allocating %d bytes of device memory", size), err)
		return 0
	}
	*b = cudaBuf{ptr: p, size: size}
	return p
}

// inU32 copies h into slot's scratch buffer.
func (x *cudaCall) inU32(slot int, h []uint32) devPtr {
	p := x.buf(slot, 4*int64(len(h)))
	if x.err == nil && len(h) > 0 {
		x.fail("copying to the device", x.w.drv.htod(p, unsafe.Pointer(&h[0]), 4*int64(len(h))))
	}
	return p
}

// launch runs kernel k on grid blocks of cudaBlock threads. Arguments are
// devPtr, int (passed as a C int) or float32.
func (x *cudaCall) launch(k cudaKernel, grid int, args ...any) {
	if x.err != nil {
		return
	}
	// Every parameter travels as 8 bytes; the driver reads as many as the
	// kernel's parameter needs from the start of them (little-endian, so a
	// C int or float sits in the low 4 bytes).
	params := make([]uint64, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case devPtr:
			params[i] = uint64(v)
		case int:
			if v < math.MinInt32 || v > math.MaxInt32 {
				x.fail(cudaKernelNames[k], fmt.Errorf("argument %d (%d) does not fit a C int", i, v))
				return
			}
			params[i] = uint64(uint32(int32(v)))
		case float32:
			params[i] = uint64(math.Float32bits(v))
		default:
			panic(fmt.Sprintf("kernels: cuda launch of %s: argument %d has type %T", cudaKernelNames[k], i, a))
		}
	}
	x.fail("launching "+cudaKernelNames[k], x.w.drv.launch(k, grid, cudaBlock, params))
}

// gridFor is the number of blocks that covers n threads, capped (the kernels
// loop over what one pass of the grid does not cover).
func gridFor(n int) int { return max(1, min((n+cudaBlock-1)/cudaBlock, 1<<16)) }

// gridForRows is the number of blocks that gives each of rows rows a warp.
func gridForRows(rows int) int { return gridFor(32 * rows) }

// need panics, like an out-of-range index in the Go backend would, when a
// tensor is shorter than the shape says.
func need(op, name string, s int, n int) {
	if s < n {
		panic(fmt.Sprintf("kernels: cuda %s: %s has %d elements, the shape needs %d", op, name, s, n))
	}
}

// dev is t's device address, after checking that t is a device tensor of at
// least n values.
func dev(op, name string, t Tensor, n int) devPtr {
	if t.host != nil {
		panic(fmt.Sprintf("kernels: cuda %s: %s is a host tensor", op, name))
	}
	need(op, name, t.n, n)
	return devPtr(t.dev)
}

// extent is how many elements a rows×cols row-major matrix with row stride ld
// spans.
func extent(rows, cols, ld int) int {
	if rows == 0 || cols == 0 {
		return 0
	}
	return (rows-1)*ld + cols
}

// Alloc implements Backend.
func (c *CUDA) Alloc(n int) Tensor {
	if n < 0 {
		panic(fmt.Sprintf("kernels: cuda Alloc of %d values", n))
	}
	if n == 0 {
		return Tensor{}
	}
	var p devPtr
	c.run("Alloc", func(x *cudaCall) {
		var err error
		if p, err = x.w.drv.alloc(4 * int64(n)); err != nil {
			x.fail(fmt.Sprintf("allocating %d MiB of device memory", (4*int64(n)+1<<20-1)>>20), err)
			return
		}
		x.fail("clearing", x.w.drv.memsetZero(p, int64(n)))
	})
	return Tensor{dev: uint64(p), n: n}
}

// Free implements Backend.
func (c *CUDA) Free(t Tensor) {
	if t.n == 0 {
		return
	}
	p := dev("Free", "t", t, 0)
	c.run("Free", func(x *cudaCall) { x.fail("freeing device memory", x.w.drv.free(p)) })
}

// Upload implements Backend.
func (c *CUDA) Upload(dst Tensor, src []float32) {
	p := dev("Upload", "dst", dst, len(src))
	if len(src) == 0 {
		return
	}
	c.run("Upload", func(x *cudaCall) {
		x.fail("copying to the device", x.w.drv.htod(p, unsafe.Pointer(&src[0]), 4*int64(len(src))))
	})
}

// Download implements Backend.
func (c *CUDA) Download(dst []float32, src Tensor) {
	p := dev("Download", "src", src, len(dst))
	if len(dst) == 0 {
		return
	}
	c.run("Download", func(x *cudaCall) {
		x.fail("copying from the device", x.w.drv.dtoh(unsafe.Pointer(&dst[0]), p, 4*int64(len(dst))))
	})
}

// Zero implements Backend.
func (c *CUDA) Zero(t Tensor) {
	if t.n == 0 {
		return
	}
	p, n := dev("Zero", "t", t, 0), int64(t.n)
	c.queue("Zero", func(x *cudaCall) { x.fail("clearing", x.w.drv.memsetZero(p, n)) })
}

// Add implements Backend.
func (c *CUDA) Add(out, a, b Tensor) {
	n := out.n
	po, pa, pb := dev("Add", "out", out, n), dev("Add", "a", a, n), dev("Add", "b", b, n)
	if n == 0 {
		return
	}
	c.queue("Add", func(x *cudaCall) { x.launch(kAdd, gridFor(n), po, pa, pb, n) })
}

// Accumulate implements Backend.
func (c *CUDA) Accumulate(src Tensor, dsts ...Tensor) {
	n := src.n
	ps := dev("Accumulate", "src", src, n)
	ds := make([]devPtr, len(dsts))
	for i, d := range dsts {
		if d.n != n {
			panic(fmt.Sprintf("kernels: cuda Accumulate: %d values into %d", n, d.n))
		}
		ds[i] = dev("Accumulate", "dst", d, n)
	}
	if n == 0 {
		return
	}
	c.queue("Accumulate", func(x *cudaCall) {
		for len(ds) >= 2 {
			x.launch(kAccumulate2, gridFor(n), ds[0], ds[1], ps, n)
			ds = ds[2:]
		}
		if len(ds) == 1 {
			x.launch(kAccumulate2, gridFor(n), ds[0], devPtr(0), ps, n)
		}
	})
}

// AddBias implements Backend.
func (c *CUDA) AddBias(out, bias Tensor, rows, cols int) {
	po, pb := dev("AddBias", "out", out, rows*cols), dev("AddBias", "bias", bias, cols)
	if rows == 0 || cols == 0 {
		return
	}
	c.queue("AddBias", func(x *cudaCall) { x.launch(kAddBias, gridFor(rows*cols), po, pb, rows, cols) })
}

// BiasBackward implements Backend.
func (c *CUDA) BiasBackward(dBias, dOut Tensor, rows, cols int) {
	pb, po := dev("BiasBackward", "dBias", dBias, cols), dev("BiasBackward", "dOut", dOut, rows*cols)
	if rows == 0 || cols == 0 {
		return
	}
	c.queue("BiasBackward", func(x *cudaCall) { x.launch(kBiasBackward, gridFor(cols), pb, po, rows, cols) })
}

func checkIDs(op string, ids []uint32, table Tensor, cols int) {
	if cols <= 0 {
		panic(fmt.Sprintf("kernels: cuda %s: %d columns", op, cols))
	}
	rows := table.n / cols
	for i, id := range ids {
		if int(id) >= rows {
			panic(fmt.Sprintf("kernels: cuda %s: id %d of row %d is outside the table of %d rows", op, id, i, rows))
		}
	}
}

// Embed implements Backend.
func (c *CUDA) Embed(out, table Tensor, ids []uint32, cols int, add bool) {
	checkIDs("Embed", ids, table, cols)
	n := len(ids)
	po, pt := dev("Embed", "out", out, n*cols), dev("Embed", "table", table, 0)
	if n == 0 {
		return
	}
	ids = append([]uint32(nil), ids...) // the caller may reuse its slice before the worker reads it
	flag := 0
	if add {
		flag = 1
	}
	c.queue("Embed", func(x *cudaCall) {
		pi := x.inU32(0, ids)
		x.launch(kEmbed, gridFor(n*cols), po, pt, pi, n, cols, flag)
	})
}

// EmbedBackward implements Backend: one thread per column, summing rows in
// index order, so repeated ids add up the same way every time.
func (c *CUDA) EmbedBackward(dTable, dOut Tensor, ids []uint32, cols int) {
	checkIDs("EmbedBackward", ids, dTable, cols)
	n := len(ids)
	pt, po := dev("EmbedBackward", "dTable", dTable, 0), dev("EmbedBackward", "dOut", dOut, n*cols)
	if n == 0 {
		return
	}
	ids = append([]uint32(nil), ids...)
	c.queue("EmbedBackward", func(x *cudaCall) {
		pi := x.inU32(0, ids)
		x.launch(kEmbedBackward, gridFor(cols), pt, po, pi, n, cols)
	})
}

// Gemm implements Backend with cublasGemmEx. cuBLAS is column-major, and a
// row-major matrix with row stride ld is its transpose in column-major order
// with leading dimension ld; so the row-major C = op(A)·op(B) is computed as
// the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands and m, n swapped, the
// transpose flags kept.
func (c *CUDA) Gemm(transA, transB bool, m, n, k int, alpha float32, a Tensor, lda int, b Tensor, ldb int, beta float32, cm Tensor, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels: cuda Gemm: negative size %d×%d×%d", m, n, k))
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	if lda < max(1, ac) || ldb < max(1, bc) || ldc < max(1, n) {
		panic(fmt.Sprintf("kernels: cuda Gemm: bad strides lda=%d ldb=%d ldc=%d for %d×%d·%d×%d", lda, ldb, ldc, ar, ac, br, bc))
	}
	da := dev("Gemm", "a", a, extent(ar, ac, lda))
	db := dev("Gemm", "b", b, extent(br, bc, ldb))
	dc := dev("Gemm", "c", cm, extent(m, n, ldc))
	if m == 0 || n == 0 {
		return
	}
	compute := c.compute
	c.queue("Gemm", func(x *cudaCall) {
		x.fail("cublasGemmEx", x.w.drv.blas.gemm(transB, transA, n, m, k, alpha, db, ldb, da, lda, beta, dc, ldc, compute))
	})
}

// LayerNorm implements Backend.
func (c *CUDA) LayerNorm(out, mean, rstd, in, weight, bias Tensor, rows, cols int) {
	const op = "LayerNorm"
	n := rows * cols
	dOut, dMean, dRstd := dev(op, "out", out, n), dev(op, "mean", mean, rows), dev(op, "rstd", rstd, rows)
	dIn, dW, dB := dev(op, "in", in, n), dev(op, "weight", weight, cols), dev(op, "bias", bias, cols)
	if rows == 0 || cols == 0 {
		return
	}
	c.queue(op, func(x *cudaCall) {
		x.launch(kLayerNormForward, gridForRows(rows), dOut, dMean, dRstd, dIn, dW, dB, rows, cols)
	})
}

// LayerNormBackward implements Backend.
func (c *CUDA) LayerNormBackward(dIn, dWeight, dBias, dOut, in, weight, mean, rstd Tensor, rows, cols int) {
	const op = "LayerNormBackward"
	n := rows * cols
	ddIn, ddW, ddB := dev(op, "dIn", dIn, n), dev(op, "dWeight", dWeight, cols), dev(op, "dBias", dBias, cols)
	ddOut, dx, dw := dev(op, "dOut", dOut, n), dev(op, "in", in, n), dev(op, "weight", weight, cols)
	dMean, dRstd := dev(op, "mean", mean, rows), dev(op, "rstd", rstd, rows)
	if rows == 0 || cols == 0 {
		return
	}
	c.queue(op, func(x *cudaCall) {
		x.launch(kLayerNormBackwardInput, gridForRows(rows), ddIn, ddOut, dx, dw, dMean, dRstd, rows, cols)
		x.launch(kLayerNormBackwardParams, gridFor(cols), ddW, ddB, ddOut, dx, dMean, dRstd, rows, cols)
	})
}

// GELU implements Backend.
func (c *CUDA) GELU(out, in Tensor) {
	n := in.n
	dOut, dIn := dev("GELU", "out", out, n), dev("GELU", "in", in, n)
	if n == 0 {
		return
	}
	c.queue("GELU", func(x *cudaCall) { x.launch(kGELUForward, gridFor(n), dOut, dIn, n) })
}

// GELUBackward implements Backend.
func (c *CUDA) GELUBackward(dIn, in, dOut Tensor) {
	n := in.n
	ddIn, dx, ddOut := dev("GELUBackward", "dIn", dIn, n), dev("GELUBackward", "in", in, n), dev("GELUBackward", "dOut", dOut, n)
	if n == 0 {
		return
	}
	c.queue("GELUBackward", func(x *cudaCall) { x.launch(kGELUBackward, gridFor(n), ddIn, dx, ddOut, n) })
}

// attentionScale checks the shape and returns 1/√(head size), as the Go
// backend computes it.
func attentionScale(op string, b, t, c, heads int) float32 {
	if b < 0 || t < 0 || c < 0 || heads <= 0 || c%heads != 0 {
		panic(fmt.Sprintf("kernels: cuda %s: bad shape b=%d t=%d c=%d heads=%d", op, b, t, c, heads))
	}
	return float32(1 / math.Sqrt(float64(c/heads)))
}

// Attention implements Backend: grouped-query attention with one query head
// per key/value head, as the Go backend computes it.
func (c *CUDA) Attention(out, att, qkv Tensor, b, t, ch, heads int) {
	scale := attentionScale("Attention", b, t, ch, heads)
	if ch == 0 {
		need("Attention", "att", att.n, b*heads*t*t)
		return
	}
	c.gqAttention("Attention", out, att, qkv, b, t, heads, heads, ch/heads, scale)
}

// AttentionBackward implements Backend, as Attention does.
func (c *CUDA) AttentionBackward(dqkv, datt, dOut, qkv, att Tensor, b, t, ch, heads int) {
	scale := attentionScale("AttentionBackward", b, t, ch, heads)
	if ch == 0 {
		need("AttentionBackward", "att", att.n, b*heads*t*t)
		need("AttentionBackward", "datt", datt.n, b*heads*t*t)
		return
	}
	c.gqAttentionBackward("AttentionBackward", dqkv, datt, dOut, qkv, att, b, t, heads, heads, ch/heads, scale)
}

func checkTargets(op string, targets []uint32, rows, vocab int) {
	need(op, "targets", len(targets), rows)
	for r, t := range targets[:rows] {
		if int(t) >= vocab {
			panic(fmt.Sprintf("kernels: cuda %s: target %d of row %d is outside the vocabulary of %d", op, t, r, vocab))
		}
	}
}

// SoftmaxCrossEntropy implements Backend.
func (c *CUDA) SoftmaxCrossEntropy(losses, logits Tensor, targets []uint32, rows, vocab int) {
	const op = "SoftmaxCrossEntropy"
	n := rows * vocab
	dLogits, dLosses := dev(op, "logits", logits, n), dev(op, "losses", losses, rows)
	checkTargets(op, targets, rows, vocab)
	if rows == 0 {
		return
	}
	if vocab == 0 {
		panic("kernels: cuda SoftmaxCrossEntropy: empty vocabulary")
	}
	targets = append([]uint32(nil), targets[:rows]...)
	c.queue(op, func(x *cudaCall) {
		dTargets := x.inU32(1, targets)
		x.launch(kSoftmaxCrossEntropy, gridForRows(rows), dLosses, dLogits, dTargets, rows, vocab)
	})
}

// CrossEntropyBackward implements Backend.
func (c *CUDA) CrossEntropyBackward(dLogits, probs Tensor, targets []uint32, rows, vocab int, scale float32) {
	const op = "CrossEntropyBackward"
	n := rows * vocab
	dd, dProbs := dev(op, "dLogits", dLogits, n), dev(op, "probs", probs, n)
	checkTargets(op, targets, rows, vocab)
	if n == 0 {
		return
	}
	targets = append([]uint32(nil), targets[:rows]...)
	c.queue(op, func(x *cudaCall) {
		dTargets := x.inU32(1, targets)
		x.launch(kCrossEntropyBackward, gridFor(n), dd, dProbs, dTargets, rows, vocab, scale)
	})
}

// Precision is the arithmetic of c's matrix products.
func (c *CUDA) Precision() Precision { return c.precision }

// withPrecision is c's device with its products at p; both share the
// device, its worker and its tensors.
func (c *CUDA) withPrecision(p Precision) Backend {
	v := *c
	v.precision, v.compute = FP32, computeFP32
	if p == BF16 {
		v.precision, v.compute = BF16, computeBF16
	}
	return &v
}

// Memory reports the device's free and total memory in bytes, after the
// work queued before it.
func (c *cudaShared) Memory() (free, total int64) {
	c.run("Memory", func(x *cudaCall) {
		var err error
		free, total, err = x.w.drv.memInfo()
		x.fail("reading the device's memory", err)
	})
	return free, total
}
