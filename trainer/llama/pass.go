package llama

import (
	"fmt"

	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// layerActs are one block's activations (or their gradients), as the
// backend keeps them. qkv holds the projections after the rotary embedding
// (what attention read).
type layerActs struct {
	norm1, norm1Rstd kernels.Tensor
	qkv, atty, att   kernels.Tensor
	attproj, resid2  kernels.Tensor
	norm2, norm2Rstd kernels.Tensor
	gateUp, swiglu   kernels.Tensor
	down, resid3     kernels.Tensor
}

type activations struct {
	arena    *lm.Arena
	encoded  kernels.Tensor
	layers   []layerActs
	norm     kernels.Tensor
	normRstd kernels.Tensor
}

func newActivations(c Config, be kernels.Backend, b, t int, stats bool) activations {
	C, BT, I := c.Width, b*t, c.Intermediate
	ar := lm.NewArena(be)
	f := ar.Alloc
	a := activations{arena: ar, encoded: f(BT * C), norm: f(BT * C)}
	if stats {
		a.normRstd = f(BT)
	}
	att := ar.AttentionProbs(b*c.Heads*t*t, stats)
	for l := 0; l < c.Layers; l++ {
		la := layerActs{norm1: f(BT * C), qkv: f(BT * c.QKVRows()), atty: f(BT * C), att: att(),
			attproj: f(BT * C), resid2: f(BT * C), norm2: f(BT * C), gateUp: f(BT * 2 * I), swiglu: f(BT * I),
			down: f(BT * C), resid3: f(BT * C)}
		if stats {
			la.norm1Rstd, la.norm2Rstd = f(BT), f(BT)
		}
		a.layers = append(a.layers, la)
	}
	return a
}

// ensure sizes the activation buffers for b sequences of t tokens.
func (m *Model) ensure(b, t int) {
	if m.b == b && m.t == t {
		return
	}
	if m.act.arena != nil {
		m.act.arena.Free()
		m.grad.arena.Free()
	}
	m.b, m.t = b, t
	m.act = newActivations(m.Config, m.be, b, t, true)
	m.grad = newActivations(m.Config, m.be, b, t, false)
	m.head = lm.NewHead(m.be, m.act.arena, b*t, m.Width, m.Vocab)
}

// matmul computes out = in·wᵀ: in is rows×ic, w is oc×ic.
func (m *Model) matmul(out, in, w kernels.Tensor, rows, ic, oc int) {
	lm.Matmul(m.be, out, in, w, kernels.Tensor{}, rows, ic, oc)
}

// matmulBackward accumulates dIn += dOut·w and dW += dOutᵀ·in.
func (m *Model) matmulBackward(dIn, dW, dOut, in, w kernels.Tensor, rows, ic, oc int) {
	lm.MatmulBackward(m.be, dIn, dW, kernels.Tensor{}, dOut, in, w, rows, ic, oc)
}

// layer is layer l's part of a stacked tensor of per-layer size n.
func layer(v kernels.Tensor, l, n int) kernels.Tensor { return lm.Layer(v, l, n) }

// Forward runs b sequences of t tokens (inputs, b·t token ids) and, if
// targets is not nil, returns the mean cross-entropy loss of predicting
// them. The activations are kept for Backward.
func (m *Model) Forward(inputs, targets []uint32, b, t int) (float32, error) {
	if err := lm.CheckBatch("llama", inputs, targets, b, t, m.Context, m.Vocab); err != nil {
		return 0, err
	}
	m.ensure(b, t)
	m.ToBackend()
	m.inputs, m.targets = inputs, targets
	C, BT, I, W, hd := m.Width, b*t, m.Intermediate, m.QKVRows(), m.HeadDim()
	p, a, eps := &m.dp, &m.act, m.Eps()

	m.be.Embed(a.encoded, p.embed, inputs, C, false)
	resid := a.encoded
	for l := 0; l < m.Layers; l++ {
		la := &a.layers[l]
		m.be.RMSNorm(la.norm1, la.norm1Rstd, resid, layer(p.attnNorm, l, C), BT, C, eps)
		m.matmul(la.qkv, la.norm1, layer(p.qkv, l, W*C), BT, C, W)
		// Queries and keys are the first Heads+KVHeads heads of each row.
		m.be.RoPE(la.qkv, b, t, W, m.Heads+m.KVHeads, hd, m.RopeTheta, false)
		m.be.GQAttention(la.atty, la.att, la.qkv, b, t, m.Heads, m.KVHeads, hd)
		m.matmul(la.attproj, la.atty, layer(p.o, l, C*C), BT, C, C)
		m.be.Add(la.resid2, resid, la.attproj)
		m.be.RMSNorm(la.norm2, la.norm2Rstd, la.resid2, layer(p.mlpNorm, l, C), BT, C, eps)
		m.matmul(la.gateUp, la.norm2, layer(p.gateUp, l, 2*I*C), BT, C, 2*I)
		m.be.SwiGLU(la.swiglu, la.gateUp, BT, I)
		m.matmul(la.down, la.swiglu, layer(p.down, l, C*I), BT, I, C)
		m.be.Add(la.resid3, la.resid2, la.down)
		resid = la.resid3
	}
	m.be.RMSNorm(a.norm, a.normRstd, resid, p.norm, BT, C, eps)
	return m.head.Forward(a.norm, p.head, targets), nil
}

// SequenceLosses returns each sequence's loss (the mean over its t
// positions) of the last Forward with targets.
func (m *Model) SequenceLosses(t int) []float32 { return m.head.SequenceLosses(t) }

// Logits returns the output of the last Forward without targets (b·t rows of
// vocab logits). On a device backend it is a host copy, made on the first
// call after a Forward.
func (m *Model) Logits() []float32 { return m.head.Logits() }

// Backward adds the gradient of the mean loss of the last Forward (which must
// have had targets) to Grads.
func (m *Model) Backward() error {
	if m.targets == nil {
		return fmt.Errorf("llama: backward needs a forward pass with targets")
	}
	b, t := m.b, m.t
	C, BT, I, W, hd, L := m.Width, b*t, m.Intermediate, m.QKVRows(), m.HeadDim(), m.Layers
	p, g, a, d := &m.dp, &m.dg, &m.act, &m.grad
	m.BeforeBackward()
	d.arena.Zero()

	m.head.Backward(d.norm, g.head, a.norm, p.head, m.targets)
	last, dLast := a.layers[L-1].resid3, d.layers[L-1].resid3
	m.be.RMSNormBackward(dLast, g.norm, d.norm, last, p.norm, a.normRstd, BT, C)
	for l := L - 1; l >= 0; l-- {
		la, dl := &a.layers[l], &d.layers[l]
		resid, dResid := a.encoded, d.encoded
		if l > 0 {
			resid, dResid = a.layers[l-1].resid3, d.layers[l-1].resid3
		}
		// resid3 = resid2 + down
		m.be.Accumulate(dl.resid3, dl.resid2, dl.down)
		m.matmulBackward(dl.swiglu, layer(g.down, l, C*I), dl.down, la.swiglu, layer(p.down, l, C*I), BT, I, C)
		m.be.SwiGLUBackward(dl.gateUp, la.gateUp, dl.swiglu, BT, I)
		m.matmulBackward(dl.norm2, layer(g.gateUp, l, 2*I*C), dl.gateUp, la.norm2, layer(p.gateUp, l, 2*I*C), BT, C, 2*I)
		m.be.RMSNormBackward(dl.resid2, layer(g.mlpNorm, l, C), dl.norm2, la.resid2, layer(p.mlpNorm, l, C), la.norm2Rstd, BT, C)
		// resid2 = resid + attproj
		m.be.Accumulate(dl.resid2, dResid, dl.attproj)
		m.matmulBackward(dl.atty, layer(g.o, l, C*C), dl.attproj, la.atty, layer(p.o, l, C*C), BT, C, C)
		m.be.GQAttentionBackward(dl.qkv, dl.att, dl.atty, la.qkv, la.att, b, t, m.Heads, m.KVHeads, hd)
		// The gradient with respect to the projections before the rotation
		// is the rotation's transpose applied to it.
		m.be.RoPE(dl.qkv, b, t, W, m.Heads+m.KVHeads, hd, m.RopeTheta, true)
		m.matmulBackward(dl.norm1, layer(g.qkv, l, W*C), dl.qkv, la.norm1, layer(p.qkv, l, W*C), BT, C, W)
		m.be.RMSNormBackward(dResid, layer(g.attnNorm, l, C), dl.norm1, resid, layer(p.attnNorm, l, C), la.norm1Rstd, BT, C)
	}
	m.be.EmbedBackward(g.embed, d.encoded, m.inputs, C)
	m.FromBackend()
	return nil
}

// hostLayer is layer l's part of a stacked host buffer of per-layer size n.
func hostLayer(v []float32, l, n int) []float32 { return lm.HostLayer(v, l, n) }
