//go:build cuda

package kernels

import (
	"fmt"
	"math"
)

// gqaScale checks a grouped-query attention shape and returns 1/√hd, as the
// Go backend computes it.
func gqaScale(op string, b, t, heads, kvHeads, hd int) float32 {
	if b < 0 || t < 0 || hd <= 0 || heads <= 0 || kvHeads <= 0 || heads%kvHeads != 0 {
		panic(fmt.Sprintf("kernels: cuda %s: bad shape b=%d t=%d heads=%d kv_heads=%d hd=%d", op, b, t, heads, kvHeads, hd))
	}
	return float32(1 / math.Sqrt(float64(hd)))
}

// GQAttention implements Backend.
func (c *CUDA) GQAttention(out, att, qkv []float32, b, t, heads, kvHeads, hd int) {
	scale := gqaScale("GQAttention", b, t, heads, kvHeads, hd)
	c.gqAttention("GQAttention", out, att, qkv, b, t, heads, kvHeads, hd, scale)
}

// GQAttentionBackward implements Backend. datt is scratch: the device keeps
// its own, and the host slice is left as it was.
func (c *CUDA) GQAttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int) {
	scale := gqaScale("GQAttentionBackward", b, t, heads, kvHeads, hd)
	c.gqAttentionBackward("GQAttentionBackward", dqkv, datt, dOut, qkv, att, b, t, heads, kvHeads, hd, scale)
}

// gqAttention checks the sizes and runs the forward kernel for op (the shape
// and scale already checked).
func (c *CUDA) gqAttention(op string, out, att, qkv []float32, b, t, heads, kvHeads, hd int, scale float32) {
	nqkv, nout, natt := b*t*(heads+2*kvHeads)*hd, b*t*heads*hd, b*heads*t*t
	need(op, "qkv", len(qkv), nqkv)
	need(op, "out", len(out), nout)
	need(op, "att", len(att), natt)
	if b == 0 || t == 0 {
		return
	}
	c.run(op, func(x *cudaCall) {
		dqkv, dOut, dAtt := x.in(0, qkv[:nqkv]), x.out(1, nout), x.out(2, natt)
		x.launch(kGQAttentionForward, gridFor(b*heads*t), dOut, dAtt, dqkv, b, t, heads, kvHeads, hd, scale)
		x.back(out[:nout], dOut)
		x.back(att[:natt], dAtt)
	})
}

// gqAttentionBackward checks the sizes and runs the two backward kernels for
// op (the shape and scale already checked).
func (c *CUDA) gqAttentionBackward(op string, dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int, scale float32) {
	nqkv, nout, natt := b*t*(heads+2*kvHeads)*hd, b*t*heads*hd, b*heads*t*t
	needs(op, nqkv, "dqkv qkv", dqkv, qkv)
	need(op, "dOut", len(dOut), nout)
	needs(op, natt, "att datt", att, datt)
	if b == 0 || t == 0 {
		return
	}
	c.run(op, func(x *cudaCall) {
		ddqkv, ddatt, ddOut := x.in(0, dqkv[:nqkv]), x.out(1, natt), x.in(2, dOut[:nout])
		dx, da := x.in(3, qkv[:nqkv]), x.in(4, att[:natt])
		x.launch(kGQAttentionBackwardQuery, gridFor(b*heads*t), ddqkv, ddatt, ddOut, dx, da, b, t, heads, kvHeads, hd, scale)
		x.launch(kGQAttentionBackwardKeyValue, gridFor(b*kvHeads*t), ddqkv, ddatt, ddOut, dx, da, b, t, heads, kvHeads, hd)
		x.back(dqkv[:nqkv], ddqkv)
	})
}

// RMSNorm implements Backend.
func (c *CUDA) RMSNorm(out, rstd, in, weight []float32, rows, cols int, eps float32) {
	n := rows * cols
	needs("RMSNorm", n, "out in", out, in)
	need("RMSNorm", "rstd", len(rstd), rows)
	need("RMSNorm", "weight", len(weight), cols)
	if rows == 0 || cols == 0 {
		return
	}
	c.run("RMSNorm", func(x *cudaCall) {
		dIn, dW := x.in(0, in[:n]), x.in(1, weight[:cols])
		dOut, dRstd := x.out(2, n), x.out(3, rows)
		x.launch(kRMSNormForward, gridForRows(rows), dOut, dRstd, dIn, dW, rows, cols, eps)
		x.back(out[:n], dOut)
		x.back(rstd[:rows], dRstd)
	})
}

// RMSNormBackward implements Backend.
func (c *CUDA) RMSNormBackward(dIn, dWeight, dOut, in, weight, rstd []float32, rows, cols int) {
	n := rows * cols
	needs("RMSNormBackward", n, "dIn dOut in", dIn, dOut, in)
	needs("RMSNormBackward", cols, "dWeight weight", dWeight, weight)
	need("RMSNormBackward", "rstd", len(rstd), rows)
	if rows == 0 || cols == 0 {
		return
	}
	c.run("RMSNormBackward", func(x *cudaCall) {
		ddIn, ddW := x.in(0, dIn[:n]), x.in(1, dWeight[:cols])
		ddOut, dx, dw, dRstd := x.in(2, dOut[:n]), x.in(3, in[:n]), x.in(4, weight[:cols]), x.in(5, rstd[:rows])
		x.launch(kRMSNormBackwardInput, gridForRows(rows), ddIn, ddOut, dx, dw, dRstd, rows, cols)
		x.launch(kRMSNormBackwardParams, gridFor(cols), ddW, ddOut, dx, dRstd, rows, cols)
		x.back(dIn[:n], ddIn)
		x.back(dWeight[:cols], ddW)
	})
}

// RoPE implements Backend. The cos/sin table is the Go backend's, computed
// on the host, so both rotate by the same float32 values.
func (c *CUDA) RoPE(x []float32, b, t, stride, heads, hd int, theta float32, inverse bool) {
	if b < 0 || t < 0 || heads < 0 || hd <= 0 || hd%2 != 0 || stride < heads*hd {
		panic(fmt.Sprintf("kernels: cuda RoPE: bad shape b=%d t=%d stride=%d heads=%d hd=%d", b, t, stride, heads, hd))
	}
	rows := b * t
	if rows == 0 || heads == 0 {
		return
	}
	n := (rows-1)*stride + heads*hd
	need("RoPE", "x", len(x), n)
	cos, sin := ropeTable(t, hd, theta)
	cs := append(cos, sin...)
	sign := float32(1)
	if inverse {
		sign = -1
	}
	c.run("RoPE", func(w *cudaCall) {
		dx, dcs := w.in(0, x[:n]), w.in(1, cs)
		w.launch(kRoPE, gridFor(rows*heads*hd/2), dx, dcs, rows, t, stride, heads, hd, sign)
		w.back(x[:n], dx)
	})
}

// SwiGLU implements Backend.
func (c *CUDA) SwiGLU(out, gateUp []float32, rows, n int) {
	need("SwiGLU", "out", len(out), rows*n)
	need("SwiGLU", "gateUp", len(gateUp), 2*rows*n)
	if rows == 0 || n == 0 {
		return
	}
	c.run("SwiGLU", func(x *cudaCall) {
		dgu, dOut := x.in(0, gateUp[:2*rows*n]), x.out(1, rows*n)
		x.launch(kSwiGLUForward, gridFor(rows*n), dOut, dgu, rows, n)
		x.back(out[:rows*n], dOut)
	})
}

// SwiGLUBackward implements Backend.
func (c *CUDA) SwiGLUBackward(dGateUp, gateUp, dOut []float32, rows, n int) {
	needs("SwiGLUBackward", 2*rows*n, "dGateUp gateUp", dGateUp, gateUp)
	need("SwiGLUBackward", "dOut", len(dOut), rows*n)
	if rows == 0 || n == 0 {
		return
	}
	c.run("SwiGLUBackward", func(x *cudaCall) {
		ddgu, dgu, ddOut := x.in(0, dGateUp[:2*rows*n]), x.in(1, gateUp[:2*rows*n]), x.in(2, dOut[:rows*n])
		x.launch(kSwiGLUBackward, gridFor(rows*n), ddgu, dgu, ddOut, rows, n)
		x.back(dGateUp[:2*rows*n], ddgu)
	})
}
