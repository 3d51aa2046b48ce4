package kernels

// Attention as batched matrix products around two row-wise steps: how the
// CUDA backend computes it (cuBLAS batched products, see llama_cuda.go),
// written once here so that the CPU tests run the same sequence of steps on
// host slices and compare it with the Go backend's loops. For sequence b and
// query head h = kh·rep + r (rep query heads share key/value head kh):
//
//	S = scale·Q_h·K_khᵀ             (t×t, into att)
//	P = causal softmax of S's rows  (in place)
//	O_h = P·V_kh
//
// and backward, dO_h given:
//
//	dP = dO_h·V_khᵀ                        (into datt)
//	dS = P ⊙ (dP − rowsum(P ⊙ dP))·scale   (in place)
//	dQ_h += dS·K_kh,  dK_kh += dSᵀ·Q_h,  dV_kh += Pᵀ·dO_h
//
// One batched product covers the KV key/value heads for one (b, r). The
// query heads of a group add into the same dK_kh and dV_kh, so the group's r
// run one after another (summed in r order, the same every time) rather than
// in one batch whose members would race.

// attnTensor names the tensors of an attention pass.
type attnTensor int

const (
	tQKV attnTensor = iota
	tOut
	tAtt
	tDQKV
	tDOut
	tDAtt
	numAttnTensors
)

// attnOperand is one operand of a batched product: the tensor, the offset
// (in values) of its first matrix, its row stride and the distance from one
// matrix of the batch to the next.
type attnOperand struct {
	t      attnTensor
	off    int64
	ld     int
	stride int64
}

// attnSteps runs the steps on some backend's memory.
type attnSteps interface {
	// gemm computes, for i < count, C_i = alpha·op(A_i)·op(B_i) + beta·C_i,
	// row-major, op(A) m×k and op(B) k×n.
	gemm(transA, transB bool, m, n, k int, alpha float32, a, b attnOperand, beta float32, c attnOperand, count int)
	// softmax is the causal softmax of att's rows rows of t (row r is
	// position r mod t: softmax over [0, r mod t], zero beyond), in place.
	softmax(rows, t int)
	// softmaxBackward turns datt's dP into dS, with att's P.
	softmaxBackward(rows, t int, scale float32)
}

type attnLayout struct {
	b, t, heads, kv, hd, rep, w, c int
}

func newAttnLayout(b, t, heads, kv, hd int) attnLayout {
	return attnLayout{b: b, t: t, heads: heads, kv: kv, hd: hd, rep: heads / kv, w: (heads + 2*kv) * hd, c: heads * hd}
}

// The operands of sequence b (and group member r), batched over the
// key/value heads.
func (l attnLayout) q(t attnTensor, b, r int) attnOperand {
	return attnOperand{t, int64(b*l.t*l.w + r*l.hd), l.w, int64(l.rep * l.hd)}
}

func (l attnLayout) k(t attnTensor, b int) attnOperand {
	return attnOperand{t, int64(b*l.t*l.w + l.c), l.w, int64(l.hd)}
}

func (l attnLayout) v(t attnTensor, b int) attnOperand {
	return attnOperand{t, int64(b*l.t*l.w + l.c + l.kv*l.hd), l.w, int64(l.hd)}
}

func (l attnLayout) o(t attnTensor, b, r int) attnOperand {
	return attnOperand{t, int64(b*l.t*l.c + r*l.hd), l.c, int64(l.rep * l.hd)}
}

func (l attnLayout) p(t attnTensor, b, r int) attnOperand {
	tt := int64(l.t) * int64(l.t)
	return attnOperand{t, int64(b*l.heads+r) * tt, l.t, int64(l.rep) * tt}
}

func attentionForward(s attnSteps, l attnLayout, scale float32) {
	t, hd := l.t, l.hd
	for b := 0; b < l.b; b++ {
		for r := 0; r < l.rep; r++ {
			s.gemm(false, true, t, t, hd, scale, l.q(tQKV, b, r), l.k(tQKV, b), 0, l.p(tAtt, b, r), l.kv)
		}
	}
	s.softmax(l.b*l.heads*t, t)
	for b := 0; b < l.b; b++ {
		for r := 0; r < l.rep; r++ {
			s.gemm(false, false, t, hd, t, 1, l.p(tAtt, b, r), l.v(tQKV, b), 0, l.o(tOut, b, r), l.kv)
		}
	}
}

func attentionBackward(s attnSteps, l attnLayout, scale float32) {
	t, hd := l.t, l.hd
	for b := 0; b < l.b; b++ {
		for r := 0; r < l.rep; r++ {
			s.gemm(false, true, t, t, hd, 1, l.o(tDOut, b, r), l.v(tQKV, b), 0, l.p(tDAtt, b, r), l.kv) // dP
		}
	}
	s.softmaxBackward(l.b*l.heads*t, t, scale)
	for b := 0; b < l.b; b++ {
		for r := 0; r < l.rep; r++ {
			dS, P := l.p(tDAtt, b, r), l.p(tAtt, b, r)
			s.gemm(false, false, t, hd, t, 1, dS, l.k(tQKV, b), 1, l.q(tDQKV, b, r), l.kv) // dQ += dS·K
			s.gemm(true, false, t, hd, t, 1, dS, l.q(tQKV, b, r), 1, l.k(tDQKV, b), l.kv)  // dK += dSᵀ·Q
			s.gemm(true, false, t, hd, t, 1, P, l.o(tDOut, b, r), 1, l.v(tDQKV, b), l.kv)  // dV += Pᵀ·dO
		}
	}
}
