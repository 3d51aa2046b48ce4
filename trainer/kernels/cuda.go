//go:build cuda

package kernels

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// CUDA is the GPU backend (-tags cuda): matrix products by cuBLAS Sgemm,
// everything else by the CUDA C kernels of cudaSource, compiled at run time
// by NVRTC and launched through the CUDA driver API (gorgonia.org/cu).
//
// The interface keeps tensors in host memory, so every call copies its inputs
// to the device, runs, and copies its outputs back; the device buffers are
// kept between calls and only grown. A buffer the interface accumulates into
// (+=) is copied in as well as out.
//
// Threading: a CUDA context is current per OS thread, so each CUDA value owns
// one goroutine locked to its OS thread (runtime.LockOSThread), on which the
// device's primary context is made current once and every driver, NVRTC and
// cuBLAS call is made. Methods send their work to that goroutine over a
// channel and wait for it, so a CUDA value is safe for concurrent use; calls
// run one at a time, in arrival order. The CUDA state (context, cuBLAS handle,
// module, buffers) is touched only by that goroutine.
//
// Failures of the device (and misuse that the Go backend would answer with an
// index-out-of-range panic) panic, since the interface has no error returns.
type CUDA struct {
	jobs   chan cudaJob
	mu     sync.RWMutex // held for reading while sending on jobs, for writing by Close
	closed bool
	device string
}

var _ Backend = (*CUDA)(nil)

type cudaJob struct {
	fn   func(*cudaCall)
	done chan error
}

// NewCUDA opens device 0 (the first of CUDA_VISIBLE_DEVICES), compiles the
// kernels for it with NVRTC and creates a cuBLAS handle.
func NewCUDA() (*CUDA, error) {
	jobs := make(chan cudaJob)
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
		w := &cudaWorker{drv: drv}
		for j := range jobs {
			j.done <- w.run(j.fn)
		}
		w.release()
	}()
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("kernels: opening the CUDA backend: %w", err)
	}
	return &CUDA{jobs: jobs, device: device}, nil
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

// Close frees the device memory, the cuBLAS handle and the module, releases
// the context and ends the worker goroutine. Calls after Close panic.
func (c *CUDA) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.jobs)
	}
	return nil
}

// run executes fn on the worker goroutine and panics with op's name if it
// failed.
func (c *CUDA) run(op string, fn func(*cudaCall)) {
	done := make(chan error, 1)
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		panic("kernels: cuda " + op + " called after Close")
	}
	c.jobs <- cudaJob{fn: fn, done: done}
	c.mu.RUnlock()
	if err := <-done; err != nil {
		panic(fmt.Sprintf("kernels: cuda %s: %v", op, err))
	}
}

// cudaSlots is the number of cached device buffers: the most tensors one
// call moves (LayerNormBackward's eight).
const cudaSlots = 8

type cudaBuf struct {
	ptr  devPtr
	size int64
}

// cudaWorker is the state owned by the worker goroutine.
type cudaWorker struct {
	drv  *cudaDriver
	bufs [cudaSlots]cudaBuf
}

func (w *cudaWorker) run(fn func(*cudaCall)) (err error) {
	call := &cudaCall{w: w}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic on the CUDA worker: %v", r)
		}
	}()
	fn(call)
	return call.err
}

func (w *cudaWorker) release() {
	for i := range w.bufs {
		if w.bufs[i].size > 0 {
			_ = w.drv.free(w.bufs[i].ptr)
			w.bufs[i] = cudaBuf{}
		}
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

// buf returns slot's device buffer, grown to at least bytes.
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

// out returns slot's buffer sized for n float32s, without copying anything in.
func (x *cudaCall) out(slot, n int) devPtr { return x.buf(slot, 4*int64(n)) }

// in copies h into slot's buffer.
func (x *cudaCall) in(slot int, h []float32) devPtr {
	p := x.out(slot, len(h))
	if x.err == nil && len(h) > 0 {
		x.fail("copying to the device", x.w.drv.htod(p, unsafe.Pointer(&h[0]), 4*int64(len(h))))
	}
	return p
}

// inU32 copies h into slot's buffer.
func (x *cudaCall) inU32(slot int, h []uint32) devPtr {
	p := x.buf(slot, 4*int64(len(h)))
	if x.err == nil && len(h) > 0 {
		x.fail("copying to the device", x.w.drv.htod(p, unsafe.Pointer(&h[0]), 4*int64(len(h))))
	}
	return p
}

// back copies len(h) float32s from d into h.
func (x *cudaCall) back(h []float32, d devPtr) {
	if x.err == nil && len(h) > 0 {
		x.fail("copying from the device", x.w.drv.dtoh(unsafe.Pointer(&h[0]), d, 4*int64(len(h))))
	}
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

// needs is need for tensors that must all hold n elements, in order, named
// by the space-separated names.
func needs(op string, n int, names string, ts ...[]float32) {
	fields := strings.Fields(names)
	if len(fields) != len(ts) {
		panic(fmt.Sprintf("kernels: cuda %s: %d names for %d tensors", op, len(fields), len(ts)))
	}
	for i, name := range fields {
		need(op, name, len(ts[i]), n)
	}
}

// extent is how many elements a rows×cols row-major matrix with row stride ld
// spans.
func extent(rows, cols, ld int) int {
	if rows == 0 || cols == 0 {
		return 0
	}
	return (rows-1)*ld + cols
}

// Gemm implements Backend with cuBLAS Sgemm. cuBLAS is column-major, and a
// row-major matrix with row stride ld is its transpose in column-major order
// with leading dimension ld; so the row-major C = op(A)·op(B) is computed as
// the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands and m, n swapped, the
// transpose flags kept.
func (c *CUDA) Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, cm []float32, ldc int) {
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
	ea, eb, ec := extent(ar, ac, lda), extent(br, bc, ldb), extent(m, n, ldc)
	need("Gemm", "a", len(a), ea)
	need("Gemm", "b", len(b), eb)
	need("Gemm", "c", len(cm), ec)
	if m == 0 || n == 0 {
		return
	}
	c.run("Gemm", func(x *cudaCall) {
		da := x.in(0, a[:ea])
		db := x.in(1, b[:eb])
		var dc devPtr
		if beta == 0 && ldc == n {
			dc = x.out(2, ec) // C is not read, and every element is written
		} else {
			dc = x.in(2, cm[:ec]) // read by beta, or gaps between rows to keep
		}
		if x.err == nil {
			x.fail("cublasSgemm", x.w.drv.sgemm(transB, transA, n, m, k, alpha, db, ldb, da, lda, beta, dc, ldc))
		}
		x.back(cm[:ec], dc)
	})
}

// LayerNorm implements Backend.
func (c *CUDA) LayerNorm(out, mean, rstd, in, weight, bias []float32, rows, cols int) {
	n := rows * cols
	needs("LayerNorm", n, "out in", out, in)
	needs("LayerNorm", rows, "mean rstd", mean, rstd)
	needs("LayerNorm", cols, "weight bias", weight, bias)
	if rows == 0 || cols == 0 {
		return
	}
	c.run("LayerNorm", func(x *cudaCall) {
		dIn, dW, dB := x.in(0, in[:n]), x.in(1, weight[:cols]), x.in(2, bias[:cols])
		dOut, dMean, dRstd := x.out(3, n), x.out(4, rows), x.out(5, rows)
		x.launch(kLayerNormForward, gridForRows(rows), dOut, dMean, dRstd, dIn, dW, dB, rows, cols)
		x.back(out[:n], dOut)
		x.back(mean[:rows], dMean)
		x.back(rstd[:rows], dRstd)
	})
}

// LayerNormBackward implements Backend.
func (c *CUDA) LayerNormBackward(dIn, dWeight, dBias, dOut, in, weight, mean, rstd []float32, rows, cols int) {
	n := rows * cols
	needs("LayerNormBackward", n, "dIn dOut in", dIn, dOut, in)
	needs("LayerNormBackward", cols, "dWeight dBias weight", dWeight, dBias, weight)
	needs("LayerNormBackward", rows, "mean rstd", mean, rstd)
	if rows == 0 || cols == 0 {
		return
	}
	c.run("LayerNormBackward", func(x *cudaCall) {
		ddIn, ddW, ddB := x.in(0, dIn[:n]), x.in(1, dWeight[:cols]), x.in(2, dBias[:cols])
		ddOut, dx, dw := x.in(3, dOut[:n]), x.in(4, in[:n]), x.in(5, weight[:cols])
		dMean, dRstd := x.in(6, mean[:rows]), x.in(7, rstd[:rows])
		x.launch(kLayerNormBackwardInput, gridForRows(rows), ddIn, ddOut, dx, dw, dMean, dRstd, rows, cols)
		x.launch(kLayerNormBackwardParams, gridFor(cols), ddW, ddB, ddOut, dx, dMean, dRstd, rows, cols)
		x.back(dIn[:n], ddIn)
		x.back(dWeight[:cols], ddW)
		x.back(dBias[:cols], ddB)
	})
}

// GELU implements Backend.
func (c *CUDA) GELU(out, in []float32) {
	n := len(in)
	need("GELU", "out", len(out), n)
	if n == 0 {
		return
	}
	c.run("GELU", func(x *cudaCall) {
		dIn, dOut := x.in(0, in), x.out(1, n)
		x.launch(kGELUForward, gridFor(n), dOut, dIn, n)
		x.back(out[:n], dOut)
	})
}

// GELUBackward implements Backend.
func (c *CUDA) GELUBackward(dIn, in, dOut []float32) {
	n := len(in)
	needs("GELUBackward", n, "dIn dOut", dIn, dOut)
	if n == 0 {
		return
	}
	c.run("GELUBackward", func(x *cudaCall) {
		ddIn, dx, ddOut := x.in(0, dIn[:n]), x.in(1, in), x.in(2, dOut[:n])
		x.launch(kGELUBackward, gridFor(n), ddIn, dx, ddOut, n)
		x.back(dIn[:n], ddIn)
	})
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
func (c *CUDA) Attention(out, att, qkv []float32, b, t, ch, heads int) {
	scale := attentionScale("Attention", b, t, ch, heads)
	if ch == 0 {
		need("Attention", "att", len(att), b*heads*t*t)
		return
	}
	c.gqAttention("Attention", out, att, qkv, b, t, heads, heads, ch/heads, scale)
}

// AttentionBackward implements Backend, as Attention does. datt is scratch:
// the device keeps its own, and the host slice is left as it was.
func (c *CUDA) AttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, ch, heads int) {
	scale := attentionScale("AttentionBackward", b, t, ch, heads)
	if ch == 0 {
		needs("AttentionBackward", b*heads*t*t, "att datt", att, datt)
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
func (c *CUDA) SoftmaxCrossEntropy(losses, logits []float32, targets []uint32, rows, vocab int) {
	n := rows * vocab
	need("SoftmaxCrossEntropy", "logits", len(logits), n)
	need("SoftmaxCrossEntropy", "losses", len(losses), rows)
	checkTargets("SoftmaxCrossEntropy", targets, rows, vocab)
	if rows == 0 {
		return
	}
	if vocab == 0 {
		panic("kernels: cuda SoftmaxCrossEntropy: empty vocabulary")
	}
	c.run("SoftmaxCrossEntropy", func(x *cudaCall) {
		dLogits, dTargets, dLosses := x.in(0, logits[:n]), x.inU32(1, targets[:rows]), x.out(2, rows)
		x.launch(kSoftmaxCrossEntropy, gridForRows(rows), dLosses, dLogits, dTargets, rows, vocab)
		x.back(logits[:n], dLogits)
		x.back(losses[:rows], dLosses)
	})
}

// CrossEntropyBackward implements Backend.
func (c *CUDA) CrossEntropyBackward(dLogits, probs []float32, targets []uint32, rows, vocab int, scale float32) {
	n := rows * vocab
	needs("CrossEntropyBackward", n, "dLogits probs", dLogits, probs)
	checkTargets("CrossEntropyBackward", targets, rows, vocab)
	if n == 0 {
		return
	}
	c.run("CrossEntropyBackward", func(x *cudaCall) {
		dProbs, dTargets, dd := x.in(0, probs[:n]), x.inU32(1, targets[:rows]), x.out(2, n)
		x.launch(kCrossEntropyBackward, gridFor(n), dd, dProbs, dTargets, rows, vocab, scale)
		x.back(dLogits[:n], dd)
	})
}
