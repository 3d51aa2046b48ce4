package kernels

import (
	"math/rand/v2"
	"time"
)

// GemmRate measures be's matrix product C = A·Bᵀ (A rows×in, B out×in) in
// GFLOP/s on tensors the backend keeps, so a device backend is timed
// without copies: the best of trials trials of at least d each (on a shared
// machine the best is the closest to what the hardware does).
func GemmRate(be Backend, rows, in, out, trials int, d time.Duration) float64 {
	r := rand.New(rand.NewPCG(2, 2))
	a, w, c := be.Alloc(rows*in), be.Alloc(out*in), be.Alloc(rows*out)
	defer func() {
		be.Free(a)
		be.Free(w)
		be.Free(c)
	}()
	for _, x := range []Tensor{a, w} {
		h := make([]float32, x.Len())
		for i := range h {
			h[i] = float32(r.NormFloat64())
		}
		be.Upload(x, h)
	}
	// Reading one value back waits for the queued products on a device.
	one := make([]float32, 1)
	wait := func() { be.Download(one, c) }
	gemm := func() { be.Gemm(false, true, rows, out, in, 1, a, in, w, in, 0, c, out) }
	gemm() // warm up
	wait()
	best := 0.0
	for trial := 0; trial < trials; trial++ {
		reps, start := 0, time.Now()
		for ; reps == 0 || time.Since(start) < d; reps++ {
			gemm()
			if reps%16 == 15 {
				wait()
			}
		}
		wait()
		best = max(best, 2*float64(rows*in*out)*float64(reps)/time.Since(start).Seconds()/1e9)
	}
	return best
}
