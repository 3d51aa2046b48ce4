//go:build cuda

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

// These tests compare the CUDA backend with the Go backend element by element
// on shapes that span several warps and blocks (kernels_test.go checks the
// math on small shapes), check that accumulating outputs accumulate and that
// results repeat bit for bit. They need a GPU.

// cudaBackend is the GPU's kernels over host slices (each call copies
// through the device), to compare with the Go backend's.
func cudaBackend(t *testing.T) Host {
	t.Helper()
	c, ok := Default().(*CUDA)
	if !ok {
		t.Fatalf("default backend is %T", Default())
	}
	t.Logf("device: %s", c.Device())
	return Slices(c)
}

// closeTo fails unless got matches want to tol relative to want's largest
// magnitude.
func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale float64 = 1e-6
	for _, w := range want {
		scale = math.Max(scale, math.Abs(float64(w)))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= tol*scale) {
			t.Fatalf("%s[%d] = %g, want %g (scale %g)", what, i, got[i], want[i], scale)
		}
	}
}

// deterministic runs fn twice and checks that the results agree
// bit for bit.
func deterministic(t *testing.T, what string, fn func() []float32) {
	t.Helper()
	a, b := fn(), fn()
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s: run 2 differs at %d: %g vs %g", what, i, a[i], b[i])
		}
	}
}

func TestCUDAGemmShapes(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(11, 11))
	for _, tc := range []struct{ m, n, k int }{{1, 1, 0}, {3, 1, 300}, {300, 2, 5}, {257, 129, 65}} {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				ar, ac := tc.m, tc.k
				if ta {
					ar, ac = tc.k, tc.m
				}
				br, bc := tc.k, tc.n
				if tb {
					br, bc = tc.n, tc.k
				}
				lda, ldb, ldc := max(ac, 1)+1, max(bc, 1), tc.n+5
				a, b, cm := randVec(r, max(ar*lda, 1)), randVec(r, max(br*ldb, 1)), randVec(r, tc.m*ldc)
				for _, beta := range []float32{0, 0.5} {
					want := slices.Clone(cm)
					Go{}.Gemm(ta, tb, tc.m, tc.n, tc.k, 1.5, a, lda, b, ldb, beta, want, ldc)
					got := slices.Clone(cm)
					c.Gemm(ta, tb, tc.m, tc.n, tc.k, 1.5, a, lda, b, ldb, beta, got, ldc)
					closeTo(t, "gemm", got, want, 1e-5)
				}
			}
		}
	}
}

func TestCUDALayerNormMatchesGo(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(12, 12))
	rows, cols := 301, 97
	in, w, b := randVec(r, rows*cols), randVec(r, cols), randVec(r, cols)
	fwd := func(be Host) (out, mean, rstd []float32) {
		out, mean, rstd = make([]float32, rows*cols), make([]float32, rows), make([]float32, rows)
		be.LayerNorm(out, mean, rstd, in, w, b, rows, cols)
		return
	}
	gOut, gMean, gRstd := fwd(Go{})
	cOut, cMean, cRstd := fwd(c)
	closeTo(t, "out", cOut, gOut, 1e-5)
	closeTo(t, "mean", cMean, gMean, 1e-5)
	closeTo(t, "rstd", cRstd, gRstd, 1e-5)
	deterministic(t, "layernorm", func() []float32 { o, _, _ := fwd(c); return o })

	dOut := randVec(r, rows*cols)
	dIn0, dW0, dB0 := randVec(r, rows*cols), randVec(r, cols), randVec(r, cols) // accumulated into
	bwd := func(be Host) (dIn, dW, dB []float32) {
		dIn, dW, dB = slices.Clone(dIn0), slices.Clone(dW0), slices.Clone(dB0)
		be.LayerNormBackward(dIn, dW, dB, dOut, in, w, gMean, gRstd, rows, cols)
		return
	}
	gIn, gW, gB := bwd(Go{})
	cIn, cW, cB := bwd(c)
	closeTo(t, "dIn", cIn, gIn, 1e-4)
	closeTo(t, "dWeight", cW, gW, 1e-4)
	closeTo(t, "dBias", cB, gB, 1e-4)
	deterministic(t, "layernorm backward", func() []float32 { _, dw, _ := bwd(c); return dw })
}

func TestCUDAGELUMatchesGo(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(13, 13))
	in := randVec(r, 100_003)
	gOut, cOut := make([]float32, len(in)), make([]float32, len(in))
	Go{}.GELU(gOut, in)
	c.GELU(cOut, in)
	closeTo(t, "gelu", cOut, gOut, 1e-5)
	dOut, dIn0 := randVec(r, len(in)), randVec(r, len(in))
	gIn, cIn := slices.Clone(dIn0), slices.Clone(dIn0)
	Go{}.GELUBackward(gIn, in, dOut)
	c.GELUBackward(cIn, in, dOut)
	closeTo(t, "gelu backward", cIn, gIn, 1e-5)
}

func TestCUDAAttentionMatchesGo(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(14, 14))
	b, tt, ch, heads := 3, 70, 48, 4
	qkv := randVec(r, b*tt*3*ch)
	fwd := func(be Host) (out, att []float32) {
		out, att = make([]float32, b*tt*ch), randVec(r, b*heads*tt*tt) // att fully overwritten
		be.Attention(out, att, qkv, b, tt, ch, heads)
		return
	}
	gOut, gAtt := fwd(Go{})
	cOut, cAtt := fwd(c)
	closeTo(t, "out", cOut, gOut, 1e-5)
	closeTo(t, "att", cAtt, gAtt, 1e-5)
	deterministic(t, "attention", func() []float32 { o, _ := fwd(c); return o })

	dOut, dqkv0 := randVec(r, len(gOut)), randVec(r, len(qkv))
	bwd := func(be Host) []float32 {
		dqkv := slices.Clone(dqkv0)
		be.AttentionBackward(dqkv, make([]float32, len(gAtt)), dOut, qkv, gAtt, b, tt, ch, heads)
		return dqkv
	}
	closeTo(t, "dqkv", bwd(c), bwd(Go{}), 1e-4)
	deterministic(t, "attention backward", func() []float32 { return bwd(c) })
}

func TestCUDACrossEntropyMatchesGo(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(15, 15))
	rows, vocab := 67, 1000
	logits := randVec(r, rows*vocab)
	for i := range logits {
		logits[i] *= 4
	}
	targets := make([]uint32, rows)
	for i := range targets {
		targets[i] = uint32(r.IntN(vocab))
	}
	fwd := func(be Host) (probs, losses []float32) {
		probs, losses = slices.Clone(logits), make([]float32, rows)
		be.SoftmaxCrossEntropy(losses, probs, targets, rows, vocab)
		return
	}
	gP, gL := fwd(Go{})
	cP, cL := fwd(c)
	closeTo(t, "probs", cP, gP, 1e-5)
	closeTo(t, "losses", cL, gL, 1e-5)
	deterministic(t, "softmax", func() []float32 { _, l := fwd(c); return l })

	gD, cD := randVec(r, rows*vocab), randVec(r, rows*vocab) // overwritten
	Go{}.CrossEntropyBackward(gD, gP, targets, rows, vocab, 0.25)
	c.CrossEntropyBackward(cD, gP, targets, rows, vocab, 0.25)
	closeTo(t, "dLogits", cD, gD, 1e-6)
}

// TestCUDABuffersGrowAndShrink runs the same op on sizes that go up and down,
// so cached device buffers are reused and regrown.
func TestCUDABuffersGrowAndShrink(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(16, 16))
	for _, n := range []int{10, 5000, 3, 70_000, 1} {
		in := randVec(r, n)
		g, d := make([]float32, n), make([]float32, n)
		Go{}.GELU(g, in)
		c.GELU(d, in)
		closeTo(t, "gelu", d, g, 1e-5)
	}
}

// TestCUDAConcurrentUse calls the backend from several goroutines at once;
// the calls are serialized on the worker that owns the context.
func TestCUDAConcurrentUse(t *testing.T) {
	c := cudaBackend(t)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(18, uint64(g)))
			for i := range 5 {
				n := 100 + 37*g + i
				in := randVec(r, n)
				want, got := make([]float32, n), make([]float32, n)
				Go{}.GELU(want, in)
				c.GELU(got, in)
				for j := range got {
					if math.Abs(float64(got[j]-want[j])) > 1e-5*math.Max(1, math.Abs(float64(want[j]))) {
						errs <- fmt.Sprintf("goroutine %d call %d: gelu[%d] = %g, want %g", g, i, j, got[j], want[j])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestCUDAClose opens a second backend, uses it, closes it, and checks that a
// call after Close panics.
func TestCUDAClose(t *testing.T) {
	c, err := NewCUDA()
	if err != nil {
		t.Fatal(err)
	}
	in, out := []float32{-1, 0, 1}, make([]float32, 3)
	Slices(c).GELU(out, in)
	if out[2] < 0.8 || out[2] > 0.9 {
		t.Fatalf("gelu(1) = %g", out[2])
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("no panic after Close")
		}
	}()
	Slices(c).GELU(out, in)
}

func BenchmarkCUDALayerNorm(b *testing.B) {
	c, ok := Default().(*CUDA)
	if !ok {
		b.Skip("not the CUDA backend")
	}
	rows, cols := 4096, 768
	in, w, bias := c.Alloc(rows*cols), c.Alloc(cols), c.Alloc(cols)
	out, mean, rstd := c.Alloc(rows*cols), c.Alloc(rows), c.Alloc(rows)
	one := make([]float32, 1)
	for b.Loop() {
		c.LayerNorm(out, mean, rstd, in, w, bias, rows, cols)
		c.Download(one, mean) // waits for the kernel
	}
}

// TestCUDATensorOps checks the memory and residual-stream operations the
// models use on the device against the host backend's, bit for bit where
// the arithmetic is the same (copies, sums of two, sums in the same order).
func TestCUDATensorOps(t *testing.T) {
	c := Default().(*CUDA)
	h := OnHost(Go{})
	r := rand.New(rand.NewPCG(19, 19))
	rows, cols, vocab := 37, 300, 11
	both := func(v []float32) (Tensor, Tensor) {
		d := c.Alloc(len(v))
		c.Upload(d, v)
		return HostTensor(slices.Clone(v)), d
	}
	same := func(what string, ht, dt Tensor) {
		t.Helper()
		got := make([]float32, dt.Len())
		c.Download(got, dt)
		for i, w := range ht.Host() {
			if math.Float32bits(got[i]) != math.Float32bits(w) {
				t.Fatalf("%s[%d] = %g on the GPU, %g on the host", what, i, got[i], w)
			}
		}
	}
	z := c.Alloc(1000)
	same("alloc", HostTensor(make([]float32, 1000)), z)
	ha, da := both(randVec(r, rows*cols))
	hb, db := both(randVec(r, rows*cols))
	ho, do := both(make([]float32, rows*cols))
	h.Add(ho, ha, hb)
	c.Add(do, da, db)
	same("add", ho, do)
	h.Accumulate(ha, ho, hb)
	c.Accumulate(da, do, db)
	same("accumulate dst 0", ho, do)
	same("accumulate dst 1", hb, db)
	h.Accumulate(hb, ho)
	c.Accumulate(db, do)
	same("accumulate one", ho, do)
	hbias, dbias := both(randVec(r, cols))
	h.AddBias(ho, hbias, rows, cols)
	c.AddBias(do, dbias, rows, cols)
	same("add bias", ho, do)
	h.BiasBackward(hbias, ha, rows, cols)
	c.BiasBackward(dbias, da, rows, cols)
	got := make([]float32, cols)
	c.Download(got, dbias)
	closeTo(t, "bias backward", got, hbias.Host(), 1e-5)
	ids := make([]uint32, rows)
	for i := range ids {
		ids[i] = uint32(r.IntN(vocab)) // repeats: summed in order
	}
	htab, dtab := both(randVec(r, vocab*cols))
	h.Embed(ho, htab, ids, cols, false)
	c.Embed(do, dtab, ids, cols, false)
	same("embed", ho, do)
	h.Embed(ho, htab, ids, cols, true)
	c.Embed(do, dtab, ids, cols, true)
	same("embed add", ho, do)
	h.EmbedBackward(htab, ha, ids, cols)
	c.EmbedBackward(dtab, da, ids, cols)
	same("embed backward", htab, dtab)
	c.Zero(do.Slice(10, 20))
	clear(ho.Host()[10:20])
	same("zero", ho, do)
	for _, d := range []Tensor{z, da, db, do, dbias, dtab} {
		c.Free(d)
	}
}

// TestCUDABF16Gemm checks the bfloat16 products against float32: inputs
// rounded to 8 bits of mantissa, sums in float32, so about 2⁻⁸ relative to
// the magnitude of the terms.
func TestCUDABF16Gemm(t *testing.T) {
	c := Default().(*CUDA)
	bf, p := WithPrecision(c, BF16)
	if p != BF16 {
		t.Fatalf("precision %s", p)
	}
	r := rand.New(rand.NewPCG(20, 20))
	m, n, k := 128, 96, 256
	a, b := randVec(r, m*k), randVec(r, n*k)
	want := make([]float32, m*n)
	Go{}.Gemm(false, true, m, n, k, 1, a, k, b, k, 0, want, n)
	got := make([]float32, m*n)
	Slices(bf).Gemm(false, true, m, n, k, 1, a, k, b, k, 0, got, n)
	closeTo(t, "bf16 gemm", got, want, 3e-2)
	var differs bool
	for i := range got {
		differs = differs || got[i] != want[i]
	}
	if !differs {
		t.Fatal("bf16 products equal float32's exactly: the precision was not applied")
	}
}

// TestCUDAFailureIsReported queues a kernel that cannot launch and checks
// that the next call that waits reports it, naming the operation.
func TestCUDAFailureIsReported(t *testing.T) {
	c, err := NewCUDA()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	x := c.Alloc(4)
	// A product whose sizes do not fit a C int cannot be passed to cuBLAS.
	c.queue("Bogus", func(w *cudaCall) { w.launch(kAdd, 1, devPtr(x.dev), devPtr(x.dev), devPtr(x.dev), 1<<40) })
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), "Bogus") {
			t.Fatalf("recovered %v, want the failure of Bogus", r)
		}
	}()
	c.Download(make([]float32, 4), x)
}

// TestCUDAPinnedTransfers moves values through page-locked host buffers
// and lets them go (their registration ends with them).
func TestCUDAPinnedTransfers(t *testing.T) {
	c := Default().(*CUDA)
	r := rand.New(rand.NewPCG(24, 24))
	src, dst := randVec(r, 1<<20), make([]float32, 1<<20)
	for _, h := range [][]float32{src, dst} {
		if err := c.Pin(h); err != nil {
			t.Fatal(err)
		}
	}
	d := c.Alloc(len(src))
	c.Upload(d, src)
	c.Download(dst, d)
	if !slices.Equal(src, dst) {
		t.Fatal("pinned round trip changed the values")
	}
	c.Free(d)
	src, dst = nil, nil
	runtime.GC()
	runtime.GC()
	c.Download(make([]float32, 1), c.Alloc(1)) // the unregistrations ran without failing
}
