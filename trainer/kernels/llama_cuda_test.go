//go:build cuda

package kernels

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The Llama kernels on the GPU against the Go backend, on shapes that span
// several warps and blocks.

func TestCUDAGQAttentionMatchesGo(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(21, 21))
	b, tt, heads, kv, hd := 3, 70, 8, 2, 16
	qkv := randVec(r, b*tt*(heads+2*kv)*hd)
	fwd := func(be Host) (out, att []float32) {
		out, att = make([]float32, b*tt*heads*hd), randVec(r, b*heads*tt*tt)
		be.GQAttention(out, att, qkv, b, tt, heads, kv, hd)
		return
	}
	gOut, gAtt := fwd(Go{})
	cOut, cAtt := fwd(c)
	closeTo(t, "out", cOut, gOut, 1e-5)
	closeTo(t, "att", cAtt, gAtt, 1e-5)
	dOut, dqkv0 := randVec(r, len(gOut)), randVec(r, len(qkv))
	bwd := func(be Host) []float32 {
		dqkv := slices.Clone(dqkv0)
		be.GQAttentionBackward(dqkv, make([]float32, len(gAtt)), dOut, qkv, gAtt, b, tt, heads, kv, hd)
		return dqkv
	}
	closeTo(t, "dqkv", bwd(c), bwd(Go{}), 1e-4)
	deterministic(t, "gqa backward", func() []float32 { return bwd(c) })
}

func TestCUDARMSNormMatchesGo(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(22, 22))
	rows, cols := 300, 200
	in, w := randVec(r, rows*cols), randVec(r, cols)
	fwd := func(be Host) (out, rstd []float32) {
		out, rstd = make([]float32, rows*cols), make([]float32, rows)
		be.RMSNorm(out, rstd, in, w, rows, cols, 1e-5)
		return
	}
	gOut, gRstd := fwd(Go{})
	cOut, cRstd := fwd(c)
	closeTo(t, "out", cOut, gOut, 1e-5)
	closeTo(t, "rstd", cRstd, gRstd, 1e-5)
	dOut, dIn0, dW0 := randVec(r, rows*cols), randVec(r, rows*cols), randVec(r, cols)
	bwd := func(be Host) []float32 {
		dIn, dW := slices.Clone(dIn0), slices.Clone(dW0)
		be.RMSNormBackward(dIn, dW, dOut, in, w, gRstd, rows, cols)
		return append(dIn, dW...)
	}
	closeTo(t, "dIn|dW", bwd(c), bwd(Go{}), 1e-4)
}

func TestCUDARoPEAndSwiGLUMatchGo(t *testing.T) {
	c := cudaBackend(t)
	r := rand.New(rand.NewPCG(23, 23))
	b, tt, heads, hd, stride := 2, 50, 6, 32, 8*32
	x0 := randVec(r, b*tt*stride)
	for _, inv := range []bool{false, true} {
		gx, cx := slices.Clone(x0), slices.Clone(x0)
		Go{}.RoPE(gx, b, tt, stride, heads, hd, 10000, inv)
		c.RoPE(cx, b, tt, stride, heads, hd, 10000, inv)
		closeTo(t, "rope", cx, gx, 1e-6)
	}
	rows, n := 300, 130
	gu := randVec(r, rows*2*n)
	gOut, cOut := make([]float32, rows*n), make([]float32, rows*n)
	Go{}.SwiGLU(gOut, gu, rows, n)
	c.SwiGLU(cOut, gu, rows, n)
	closeTo(t, "swiglu", cOut, gOut, 1e-6)
	dOut, d0 := randVec(r, rows*n), randVec(r, rows*2*n)
	gd, cd := slices.Clone(d0), slices.Clone(d0)
	Go{}.SwiGLUBackward(gd, gu, dOut, rows, n)
	c.SwiGLUBackward(cd, gu, dOut, rows, n)
	closeTo(t, "swiglu backward", cd, gd, 1e-5)
}
