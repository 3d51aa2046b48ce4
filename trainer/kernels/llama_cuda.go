//go:build cuda

package kernels

import (
	"fmt"
	"math"
	"unsafe"
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
func (c *CUDA) GQAttention(out, att, qkv Tensor, b, t, heads, kvHeads, hd int) {
	scale := gqaScale("GQAttention", b, t, heads, kvHeads, hd)
	c.gqAttention("GQAttention", out, att, qkv, b, t, heads, kvHeads, hd, scale)
}

// GQAttentionBackward implements Backend.
func (c *CUDA) GQAttentionBackward(dqkv, datt, dOut, qkv, att Tensor, b, t, heads, kvHeads, hd int) {
	scale := gqaScale("GQAttentionBackward", b, t, heads, kvHeads, hd)
	c.gqAttentionBackward("GQAttentionBackward", dqkv, datt, dOut, qkv, att, b, t, heads, kvHeads, hd, scale)
}

// cudaAttn runs attention's steps (attention_batched.go) on the device:
// cuBLAS batched products and the causal softmax kernels.
type cudaAttn struct {
	x       *cudaCall
	ptr     [numAttnTensors]devPtr
	compute cublasCompute
}

func (a *cudaAttn) operand(o attnOperand) strided {
	return strided{a.ptr[o.t] + devPtr(4*o.off), o.ld, o.stride}
}

func (a *cudaAttn) gemm(transA, transB bool, m, n, k int, alpha float32, x, y attnOperand, beta float32, z attnOperand, count int) {
	if a.x.err == nil {
		a.x.fail("attention product", a.x.w.drv.blas.gemmBatched(transA, transB, m, n, k, alpha, a.operand(x), a.operand(y), beta, a.operand(z), count, a.compute))
	}
}

func (a *cudaAttn) softmax(rows, t int) {
	a.x.launch(kCausalSoftmax, gridForRows(rows), a.ptr[tAtt], rows, t)
}

func (a *cudaAttn) softmaxBackward(rows, t int, scale float32) {
	a.x.launch(kCausalSoftmaxBackward, gridForRows(rows), a.ptr[tDAtt], a.ptr[tAtt], rows, t, scale)
}

// gqAttention checks the sizes and queues the forward pass for op (the
// shape and scale already checked).
func (c *CUDA) gqAttention(op string, out, att, qkv Tensor, b, t, heads, kvHeads, hd int, scale float32) {
	nqkv, nout, natt := b*t*(heads+2*kvHeads)*hd, b*t*heads*hd, b*heads*t*t
	dqkv, dOut, dAtt := dev(op, "qkv", qkv, nqkv), dev(op, "out", out, nout), dev(op, "att", att, natt)
	if b == 0 || t == 0 {
		return
	}
	l, compute := newAttnLayout(b, t, heads, kvHeads, hd), c.compute
	c.queue(op, func(x *cudaCall) {
		a := &cudaAttn{x: x, compute: compute}
		a.ptr[tQKV], a.ptr[tOut], a.ptr[tAtt] = dqkv, dOut, dAtt
		attentionForward(a, l, scale)
	})
}

// gqAttentionBackward checks the sizes and queues the backward pass for op
// (the shape and scale already checked).
func (c *CUDA) gqAttentionBackward(op string, dqkv, datt, dOut, qkv, att Tensor, b, t, heads, kvHeads, hd int, scale float32) {
	nqkv, nout, natt := b*t*(heads+2*kvHeads)*hd, b*t*heads*hd, b*heads*t*t
	ddqkv, ddatt, ddOut := dev(op, "dqkv", dqkv, nqkv), dev(op, "datt", datt, natt), dev(op, "dOut", dOut, nout)
	dx, da := dev(op, "qkv", qkv, nqkv), dev(op, "att", att, natt)
	if b == 0 || t == 0 {
		return
	}
	l, compute := newAttnLayout(b, t, heads, kvHeads, hd), c.compute
	c.queue(op, func(x *cudaCall) {
		a := &cudaAttn{x: x, compute: compute}
		a.ptr[tQKV], a.ptr[tAtt], a.ptr[tDQKV], a.ptr[tDOut], a.ptr[tDAtt] = dx, da, ddqkv, ddOut, ddatt
		attentionBackward(a, l, scale)
	})
}

// RMSNorm implements Backend.
func (c *CUDA) RMSNorm(out, rstd, in, weight Tensor, rows, cols int, eps float32) {
	const op = "RMSNorm"
	n := rows * cols
	dOut, dRstd, dIn, dW := dev(op, "out", out, n), dev(op, "rstd", rstd, rows), dev(op, "in", in, n), dev(op, "weight", weight, cols)
	if rows == 0 || cols == 0 {
		return
	}
	c.queue(op, func(x *cudaCall) {
		x.launch(kRMSNormForward, gridForRows(rows), dOut, dRstd, dIn, dW, rows, cols, eps)
	})
}

// RMSNormBackward implements Backend.
func (c *CUDA) RMSNormBackward(dIn, dWeight, dOut, in, weight, rstd Tensor, rows, cols int) {
	const op = "RMSNormBackward"
	n := rows * cols
	ddIn, ddW, ddOut := dev(op, "dIn", dIn, n), dev(op, "dWeight", dWeight, cols), dev(op, "dOut", dOut, n)
	dx, dw, dRstd := dev(op, "in", in, n), dev(op, "weight", weight, cols), dev(op, "rstd", rstd, rows)
	if rows == 0 || cols == 0 {
		return
	}
	c.queue(op, func(x *cudaCall) {
		x.launch(kRMSNormBackwardInput, gridForRows(rows), ddIn, ddOut, dx, dw, dRstd, rows, cols)
		x.launch(kRMSNormBackwardParams, gridFor(cols), ddW, ddOut, dx, dRstd, rows, cols)
	})
}

// ropeTableOnDevice returns the cos/sin table for (t, hd, theta), computed
// on the host by the Go backend's code (so both backends rotate by the same
// float32 values) and uploaded the first time it is needed.
func (x *cudaCall) ropeTableOnDevice(t, hd int, theta float32) devPtr {
	key := ropeKey{t, hd, theta}
	if p, ok := x.w.rope[key]; ok || x.err != nil {
		return p
	}
	cos, sin := ropeTable(t, hd, theta)
	cs := append(cos, sin...)
	p, err := x.w.drv.alloc(4 * int64(len(cs)))
	if err != nil {
		x.fail("allocating the rotary table", err)
		return 0
	}
	if err := x.w.drv.htod(p, unsafe.Pointer(&cs[0]), 4*int64(len(cs))); err != nil {
		_ = x.w.drv.free(p)
		x.fail("copying the rotary table", err)
		return 0
	}
	x.w.rope[key] = p
	return p
}

// RoPE implements Backend.
func (c *CUDA) RoPE(x Tensor, b, t, stride, heads, hd int, theta float32, inverse bool) {
	if b < 0 || t < 0 || heads < 0 || hd <= 0 || hd%2 != 0 || stride < heads*hd {
		panic(fmt.Sprintf("kernels: cuda RoPE: bad shape b=%d t=%d stride=%d heads=%d hd=%d", b, t, stride, heads, hd))
	}
	rows := b * t
	if rows == 0 || heads == 0 {
		return
	}
	dx := dev("RoPE", "x", x, (rows-1)*stride+heads*hd)
	sign := float32(1)
	if inverse {
		sign = -1
	}
	c.queue("RoPE", func(w *cudaCall) {
		dcs := w.ropeTableOnDevice(t, hd, theta)
		w.launch(kRoPE, gridFor(rows*heads*hd/2), dx, dcs, rows, t, stride, heads, hd, sign)
	})
}

// SwiGLU implements Backend.
func (c *CUDA) SwiGLU(out, gateUp Tensor, rows, n int) {
	dOut, dgu := dev("SwiGLU", "out", out, rows*n), dev("SwiGLU", "gateUp", gateUp, 2*rows*n)
	if rows == 0 || n == 0 {
		return
	}
	c.queue("SwiGLU", func(x *cudaCall) { x.launch(kSwiGLUForward, gridFor(rows*n), dOut, dgu, rows, n) })
}

// SwiGLUBackward implements Backend.
func (c *CUDA) SwiGLUBackward(dGateUp, gateUp, dOut Tensor, rows, n int) {
	const op = "SwiGLUBackward"
	ddgu, dgu, ddOut := dev(op, "dGateUp", dGateUp, 2*rows*n), dev(op, "gateUp", gateUp, 2*rows*n), dev(op, "dOut", dOut, rows*n)
	if rows == 0 || n == 0 {
		return
	}
	c.queue(op, func(x *cudaCall) { x.launch(kSwiGLUBackward, gridFor(rows*n), ddgu, dgu, ddOut, rows, n) })
}
