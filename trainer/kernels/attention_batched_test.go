package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// hostAttn runs attention's batched steps (the GPU's sequence) on host
// slices with the Go backend's products, one matrix of a batch at a time.
type hostAttn struct{ ts [numAttnTensors][]float32 }

func (h *hostAttn) gemm(transA, transB bool, m, n, k int, alpha float32, a, b attnOperand, beta float32, c attnOperand, count int) {
	for i := 0; i < count; i++ {
		at := h.ts[a.t][a.off+int64(i)*a.stride:]
		bt := h.ts[b.t][b.off+int64(i)*b.stride:]
		ct := h.ts[c.t][c.off+int64(i)*c.stride:]
		Go{}.Gemm(transA, transB, m, n, k, alpha, at, a.ld, bt, b.ld, beta, ct, c.ld)
	}
}

func (h *hostAttn) softmax(rows, t int) {
	for r := 0; r < rows; r++ {
		row, ti := h.ts[tAtt][r*t:(r+1)*t], r%t
		maxv := float32(math.Inf(-1))
		for _, v := range row[:ti+1] {
			maxv = max(maxv, v)
		}
		causalSoftmax(row, ti, maxv)
	}
}

func (h *hostAttn) softmaxBackward(rows, t int, scale float32) {
	for r := 0; r < rows; r++ {
		d, p, ti := h.ts[tDAtt][r*t:(r+1)*t], h.ts[tAtt][r*t:(r+1)*t], r%t
		var s float32
		for i := 0; i <= ti; i++ {
			s += p[i] * d[i]
		}
		for i := range d {
			if i <= ti {
				d[i] = p[i] * (d[i] - s) * scale
			} else {
				d[i] = 0
			}
		}
	}
}

// TestBatchedAttentionMatchesLoops checks the GPU's sequence of batched
// products (its operand offsets and strides, transposes and accumulation)
// against the Go backend's loops, on the CPU.
func TestBatchedAttentionMatchesLoops(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 23))
	for _, tc := range []struct{ b, t, heads, kv, hd int }{
		{2, 5, 4, 2, 4}, {1, 6, 6, 1, 2}, {2, 4, 3, 3, 4}, {3, 9, 8, 2, 6},
	} {
		n := tc.b * tc.t * (tc.heads + 2*tc.kv) * tc.hd
		qkv := randVec(r, n)
		out, att := make([]float32, tc.b*tc.t*tc.heads*tc.hd), make([]float32, tc.b*tc.heads*tc.t*tc.t)
		Go{}.GQAttention(out, att, qkv, tc.b, tc.t, tc.heads, tc.kv, tc.hd)
		h := &hostAttn{}
		h.ts[tQKV], h.ts[tOut], h.ts[tAtt] = qkv, make([]float32, len(out)), randVec(r, len(att))
		l, scale := newAttnLayout(tc.b, tc.t, tc.heads, tc.kv, tc.hd), float32(1/math.Sqrt(float64(tc.hd)))
		attentionForward(h, l, scale)
		closeToF(t, "out", h.ts[tOut], out, 1e-5)
		closeToF(t, "att", h.ts[tAtt], att, 1e-5)

		dOut, dqkv0 := randVec(r, len(out)), randVec(r, n)
		want := slices.Clone(dqkv0)
		Go{}.GQAttentionBackward(want, make([]float32, len(att)), dOut, qkv, att, tc.b, tc.t, tc.heads, tc.kv, tc.hd)
		h.ts[tDQKV], h.ts[tDOut], h.ts[tDAtt] = slices.Clone(dqkv0), dOut, randVec(r, len(att))
		attentionBackward(h, l, scale)
		closeToF(t, "dqkv", h.ts[tDQKV], want, 1e-4)
	}
}

func closeToF(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
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
