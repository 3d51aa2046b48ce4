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
	logits  kernels.Tensor // a chunk of the output layer's rows (lm.HeadRows), scratch
	full    kernels.Tensor // all b·t rows of logits, made by the first Forward without targets
	losses  kernels.Tensor
}

func (c Config) newActivations(be kernels.Backend, b, t int, stats bool) activations {
	C, BT := c.Width, b*t
	ar := lm.NewArena(be)
	f := ar.Alloc
	a := activations{arena: ar, encoded: f(BT * C), lnf: f(BT * C)}
	if stats {
		a.lnfMean, a.lnfRstd, a.losses = f(BT), f(BT), f(BT)
		a.logits = f(lm.HeadRows(c.Vocab, BT) * c.Vocab)
	}
	// The attention probabilities are kept per layer for the backward
	// pass; their gradient is scratch within one layer's backward, so the
	// gradients' layers share one (a 1B model at 2048 tokens: 8.6 GB less).
	var sharedAtt kernels.Tensor
	if !stats {
		sharedAtt = f(b * c.Heads * t * t)
	}
	att := func() kernels.Tensor {
		if stats {
			return f(b * c.Heads * t * t)
		}
		return sharedAtt
	}
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
	m.act = m.Config.newActivations(m.be, b, t, true)
	m.grad = m.Config.newActivations(m.be, b, t, false)
	m.losses = make([]float32, b*t)
	m.positions = make([]uint32, b*t)
	for i := range m.positions {
		m.positions[i] = uint32(i % t)
	}
	m.logits = nil
}

// matmul computes out = in·wᵀ + bias for rows rows: in is rows×ic, w is oc×ic.
func (m *Model) matmul(out, in, w, bias kernels.Tensor, rows, ic, oc int) {
	m.be.Gemm(false, true, rows, oc, ic, 1, in, ic, w, ic, 0, out, oc)
	if bias.Len() > 0 {
		m.be.AddBias(out, bias, rows, oc)
	}
}

// matmulBackward accumulates dIn += dOut·w, dW += dOutᵀ·in, dBias += Σ dOut.
func (m *Model) matmulBackward(dIn, dW, dBias, dOut, in, w kernels.Tensor, rows, ic, oc int) {
	m.be.Gemm(false, false, rows, ic, oc, 1, dOut, oc, w, ic, 1, dIn, ic)
	m.be.Gemm(true, false, oc, ic, rows, 1, dOut, oc, in, ic, 1, dW, ic)
	if dBias.Len() > 0 {
		m.be.BiasBackward(dBias, dOut, rows, oc)
	}
}

// per is layer l's part of a stacked tensor of per-layer size n.
func per(v kernels.Tensor, l, n int) kernels.Tensor { return v.Slice(l*n, (l+1)*n) }

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
	m.logits = nil
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
	if targets == nil {
		if a.full.Len() == 0 {
			a.full = a.arena.Alloc(BT * m.Vocab)
		}
		m.matmul(a.full, a.lnf, p.wte, kernels.Tensor{}, BT, C, m.Vocab)
		return 0, nil
	}
	lm.HeadLoss(m.be, a.losses, a.logits, a.lnf, p.wte, targets, BT, C, m.Vocab)
	m.be.Download(m.losses, a.losses)
	return lm.MeanLoss(m.losses), nil
}

// SequenceLosses returns each sequence's loss (the mean over its t
// positions) of the last Forward with targets.
func (m *Model) SequenceLosses(t int) []float32 { return lm.SequenceLosses(m.losses, t) }

// Logits returns the output of the last Forward without targets (b·t rows of
// vocab logits). On a device backend it is a host copy, made on the first
// call after a Forward.
func (m *Model) Logits() []float32 {
	if kernels.InHostMemory(m.be) {
		return m.act.full.Host()
	}
	if m.logits == nil {
		m.logits = make([]float32, m.act.full.Len())
		m.be.Download(m.logits, m.act.full)
	}
	return m.logits
}

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

	lm.HeadBackward(m.be, d.lnf, g.wte, a.losses, a.logits, a.lnf, p.wte, m.targets, BT, C, m.Vocab, 1/float32(BT))
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

// FLOPsPerToken estimates the floating-point operations of one forward and
// backward pass per token (6 per parameter for the matrix products, plus
// attention): the figure tokens/s is turned into GFLOP/s with.
func (c Config) FLOPsPerToken(t int) float64 {
	C, L := float64(c.Width), float64(c.Layers)
	matmul := 6 * (L*12*C*C + float64(c.Vocab)*C)
	attention := 6 * L * float64(t) * C // q·k and att·v, forward and backward, about half masked
	return matmul + attention
}
