package kernels

import "math"

// gemmFunc is a backend's Gemm.
type gemmFunc func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

// gqAttentionGemm is grouped-query attention as matrix products: for each
// (sequence, query head) the scores Q·Kᵀ/√hd and the output att·V are one
// Gemm each, reading the heads in place through the row stride of qkv; only
// the masked softmax between them is a loop. The products compute the whole
// t×t square, masked half included: twice the useful arithmetic, but at the
// matrix-product rate, many times the scalar loops' (gqAttentionLoops).
func gqAttentionGemm(gemm gemmFunc, out, att, qkv []float32, b, t, heads, kvHeads, hd int) {
	w, kOff, vOff, rep := gqaLayout(heads, kvHeads, hd)
	c := heads * hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	for bh := 0; bh < b*heads; bh++ {
		bi, h := bh/heads, bh%heads
		kh, base := h/rep, bi*t*w
		gemm(false, true, t, t, hd, scale, qkv[base+h*hd:], w, qkv[base+kOff+kh*hd:], w, 0, att[bh*t*t:(bh+1)*t*t], t)
	}
	parallel(b*heads*t, chunkRows, func(lo, hi int) {
		for row := lo; row < hi; row++ {
			ti := row % t
			a := att[row*t : (row+1)*t]
			maxv := a[0]
			for _, v := range a[:ti+1] {
				if v > maxv || v != v {
					maxv = v
				}
			}
			causalSoftmax(a, ti, maxv)
		}
	})
	for bh := 0; bh < b*heads; bh++ {
		bi, h := bh/heads, bh%heads
		kh, base := h/rep, bi*t*w
		gemm(false, false, t, hd, t, 1, att[bh*t*t:(bh+1)*t*t], t, qkv[base+vOff+kh*hd:], w, 0, out[bi*t*c+h*hd:], c)
	}
}

// gqAttentionBackwardGemm is gqAttentionGemm's backward pass: per (sequence,
// query head) d(att) = dOut·Vᵀ and dV += attᵀ·dOut, the softmax's backward
// row by row into datt (the score gradient, scaled by 1/√hd, zero where
// masked), then dQ += dS·K and dK += dSᵀ·Q. The products run one after
// another, so the query heads sharing a key/value head add to its
// gradient in a fixed order.
func gqAttentionBackwardGemm(gemm gemmFunc, dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int) {
	w, kOff, vOff, rep := gqaLayout(heads, kvHeads, hd)
	c := heads * hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	for bh := 0; bh < b*heads; bh++ {
		bi, h := bh/heads, bh%heads
		kh, base := h/rep, bi*t*w
		a, da := att[bh*t*t:(bh+1)*t*t], datt[bh*t*t:(bh+1)*t*t]
		do := dOut[bi*t*c+h*hd:]
		gemm(false, true, t, t, hd, 1, do, c, qkv[base+vOff+kh*hd:], w, 0, da, t)
		gemm(true, false, t, hd, t, 1, a, t, do, c, 1, dqkv[base+vOff+kh*hd:], w)
	}
	parallel(b*heads*t, chunkRows, func(lo, hi int) {
		for row := lo; row < hi; row++ {
			ti := row % t
			a, da := att[row*t:(row+1)*t], datt[row*t:(row+1)*t]
			var s float32
			for t2 := 0; t2 <= ti; t2++ {
				s += a[t2] * da[t2]
			}
			for t2 := range da {
				if t2 <= ti {
					da[t2] = a[t2] * (da[t2] - s) * scale
				} else {
					da[t2] = 0
				}
			}
		}
	})
	for bh := 0; bh < b*heads; bh++ {
		bi, h := bh/heads, bh%heads
		kh, base := h/rep, bi*t*w
		ds := datt[bh*t*t : (bh+1)*t*t]
		gemm(false, false, t, hd, t, 1, ds, t, qkv[base+kOff+kh*hd:], w, 1, dqkv[base+h*hd:], w)
		gemm(true, false, t, hd, t, 1, ds, t, qkv[base+h*hd:], w, 1, dqkv[base+kOff+kh*hd:], w)
	}
}
