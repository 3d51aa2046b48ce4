package gpt

import (
	"fmt"

	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// layerActs are one block's activations (or their gradients), as the
// backend keeps them.
type layerActs struct {
	ln1, ln1Mean, ln1Rstd kernels.Tensor
	qkv, atty, att        kernels.Tensor
	attproj, resid2       kernels.Tensor
	ln2, ln2Mean, ln2Rstd kernels.Tensor
	fch, fchGelu, fcproj  kernels.Tensor
	resid3                kernels.Tensor
}

type activations struct {
	arena   *lm.Arena
	encoded kernels.Tensor
	layers  []layerActs
	lnf     kernels.Tensor
	lnfMean kernels.Tensor
	lnfRstd kernels.Tensor
}

func newActivations(c Config, be kernels.Backend, b, t int, stats bool) activations {
	C, BT := c.Width, b*t
	ar := lm.NewArena(be)
	f := ar.Alloc
	a := activations{arena: ar, encoded: f(BT * C), lnf: f(BT * C)}
	if stats {
		a.lnfMean, a.lnfRstd = f(BT), f(BT)
	}
	att := ar.AttentionProbs(b*c.Heads*t*t, stats)
	for l := 0; l < c.Layers; l++ {
		la := layerActs{ln1: f(BT * C), qkv: f(BT * 3 * C), atty: f(BT * C), att: att(),
			attproj: f(BT * C), resid2: f(BT * C), ln2: f(BT * C), fch: f(BT * 4 * C), fchGelu: f(BT * 4 * C),
			fcproj: f(BT * C), resid3: f(BT * C)}
		if stats {
			la.ln1Mean, la.ln1Rstd, la.ln2Mean, la.ln2Rstd = f(BT), f(BT), f(BT), f(BT)
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
	m.positions = make([]uint32, b*t)
	for i := range m.positions {
		m.positions[i] = uint32(i % t)
	}
}

// matmul computes out = in·wᵀ + bias for rows rows: in is rows×ic, w is oc×ic.
func (m *Model) matmul(out, in, w, bias kernels.Tensor, rows, ic, oc int) {
	lm.Matmul(m.be, out, in, w, bias, rows, ic, oc)
}

// matmulBackward accumulates dIn += dOut·w, dW += dOutᵀ·in, dBias += Σ dOut.
func (m *Model) matmulBackward(dIn, dW, dBias, dOut, in, w kernels.Tensor, rows, ic, oc int) {
	lm.MatmulBackward(m.be, dIn, dW, dBias, dOut, in, w, rows, ic, oc)
}

// per is layer l's part of a stacked tensor of per-layer size n.
func per(v kernels.Tensor, l, n int) kernels.Tensor { return lm.Layer(v, l, n) }

// Forward runs b sequences of t tokens (inputs, b·t token ids) and, if
// targets is not nil, returns the mean cross-entropy loss of predicting
// them. The activations are kept for Backward.
func (m *Model) Forward(inputs, targets []uint32, b, t int) (float32, error) {
	if err := lm.CheckBatch("gpt", inputs, targets, b, t, m.Context, m.Vocab); err != nil {
		return 0, err
	}
	m.ensure(b, t)
	m.ToBackend()
	m.inputs, m.targets = inputs, targets
	C, BT, L := m.Width, b*t, m.Layers
	p, a := &m.dp, &m.act

	// token + position embedding
	m.be.Embed(a.encoded, p.wte, inputs, C, false)
	m.be.Embed(a.encoded, p.wpe, m.positions, C, true)
	resid := a.encoded
	for l := 0; l < L; l++ {
		la := &a.layers[l]
		m.be.LayerNorm(la.ln1, la.ln1Mean, la.ln1Rstd, resid, per(p.ln1w, l, C), per(p.ln1b, l, C), BT, C)
		m.matmul(la.qkv, la.ln1, per(p.qkvw, l, 3*C*C), per(p.qkvb, l, 3*C), BT, C, 3*C)
		m.be.Attention(la.atty, la.att, la.qkv, b, t, C, m.Heads)
		m.matmul(la.attproj, la.atty, per(p.projw, l, C*C), per(p.projb, l, C), BT, C, C)
		m.be.Add(la.resid2, resid, la.attproj)
		m.be.LayerNorm(la.ln2, la.ln2Mean, la.ln2Rstd, la.resid2, per(p.ln2w, l, C), per(p.ln2b, l, C), BT, C)
		m.matmul(la.fch, la.ln2, per(p.fcw, l, 4*C*C), per(p.fcb, l, 4*C), BT, C, 4*C)
		m.be.GELU(la.fchGelu, la.fch)
		m.matmul(la.fcproj, la.fchGelu, per(p.fcprojw, l, 4*C*C), per(p.fcprojb, l, C), BT, 4*C, C)
		m.be.Add(la.resid3, la.resid2, la.fcproj)
		resid = la.resid3
	}
	m.be.LayerNorm(a.lnf, a.lnfMean, a.lnfRstd, resid, p.lnfw, p.lnfb, BT, C)
	// The output layer is the token embedding, transposed.
	return m.head.Forward(a.lnf, p.wte, targets), nil
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
		return fmt.Errorf("gpt: backward needs a forward pass with targets")
	}
	b, t := m.b, m.t
	C, BT, L := m.Width, b*t, m.Layers
	p, g, a, d := &m.dp, &m.dg, &m.act, &m.grad
	m.BeforeBackward()
	d.arena.Zero()

	m.head.Backward(d.lnf, g.wte, a.lnf, p.wte, m.targets)
	lastResid := a.encoded
	dLast := d.encoded
	if L > 0 {
		lastResid = a.layers[L-1].resid3
		dLast = d.layers[L-1].resid3
	}
	m.be.LayerNormBackward(dLast, g.lnfw, g.lnfb, d.lnf, lastResid, p.lnfw, a.lnfMean, a.lnfRstd, BT, C)
	for l := L - 1; l >= 0; l-- {
		la, dl := &a.layers[l], &d.layers[l]
		resid, dResid := a.encoded, d.encoded
		if l > 0 {
			resid, dResid = a.layers[l-1].resid3, d.layers[l-1].resid3
		}
		// resid3 = resid2 + fcproj
		m.be.Accumulate(dl.resid3, dl.resid2, dl.fcproj)
		m.matmulBackward(dl.fchGelu, per(g.fcprojw, l, 4*C*C), per(g.fcprojb, l, C), dl.fcproj, la.fchGelu, per(p.fcprojw, l, 4*C*C), BT, 4*C, C)
		m.be.GELUBackward(dl.fch, la.fch, dl.fchGelu)
		m.matmulBackward(dl.ln2, per(g.fcw, l, 4*C*C), per(g.fcb, l, 4*C), dl.fch, la.ln2, per(p.fcw, l, 4*C*C), BT, C, 4*C)
		m.be.LayerNormBackward(dl.resid2, per(g.ln2w, l, C), per(g.ln2b, l, C), dl.ln2, la.resid2, per(p.ln2w, l, C), la.ln2Mean, la.ln2Rstd, BT, C)
		// resid2 = resid + attproj
		m.be.Accumulate(dl.resid2, dResid, dl.attproj)
		m.matmulBackward(dl.atty, per(g.projw, l, C*C), per(g.projb, l, C), dl.attproj, la.atty, per(p.projw, l, C*C), BT, C, C)
		m.be.AttentionBackward(dl.qkv, dl.att, dl.atty, la.qkv, la.att, b, t, C, m.Heads)
		m.matmulBackward(dl.ln1, per(g.qkvw, l, 3*C*C), per(g.qkvb, l, 3*C), dl.qkv, la.ln1, per(p.qkvw, l, 3*C*C), BT, C, 3*C)
		m.be.LayerNormBackward(dResid, per(g.ln1w, l, C), per(g.ln1b, l, C), dl.ln1, resid, per(p.ln1w, l, C), la.ln1Mean, la.ln1Rstd, BT, C)
	}
	m.be.EmbedBackward(g.wte, d.encoded, m.inputs, C)
	m.be.EmbedBackward(g.wpe, d.encoded, m.positions, C)
	m.FromBackend()
	return nil
}
