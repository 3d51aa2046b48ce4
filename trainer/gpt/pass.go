package gpt

import (
	"fmt"

	"github.com/psyche-go/psyche/trainer/internal/lm"
)

// layerActs are one block's activations (or their gradients).
type layerActs struct {
	ln1, ln1Mean, ln1Rstd []float32
	qkv, atty, att        []float32
	attproj, resid2       []float32
	ln2, ln2Mean, ln2Rstd []float32
	fch, fchGelu, fcproj  []float32
	resid3                []float32
}

type activations struct {
	encoded []float32
	layers  []layerActs
	lnf     []float32
	lnfMean []float32
	lnfRstd []float32
	logits  []float32 // probabilities after the forward pass
	losses  []float32
}

func (c Config) newActivations(b, t int, stats bool) activations {
	C, BT := c.Width, b*t
	f := func(n int) []float32 { return make([]float32, n) }
	a := activations{encoded: f(BT * C), lnf: f(BT * C), logits: f(BT * c.Vocab)}
	if stats {
		a.lnfMean, a.lnfRstd, a.losses = f(BT), f(BT), f(BT)
	}
	for l := 0; l < c.Layers; l++ {
		la := layerActs{ln1: f(BT * C), qkv: f(BT * 3 * C), atty: f(BT * C), att: f(b * c.Heads * t * t),
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
	m.b, m.t = b, t
	m.act = m.Config.newActivations(b, t, true)
	m.grad = m.Config.newActivations(b, t, false)
}

// matmul computes out = in·wᵀ + bias for rows rows: in is rows×ic, w is oc×ic.
func (m *Model) matmul(out, in, w, bias []float32, rows, ic, oc int) {
	m.be.Gemm(false, true, rows, oc, ic, 1, in, ic, w, ic, 0, out, oc)
	if bias != nil {
		for r := 0; r < rows; r++ {
			row := out[r*oc : (r+1)*oc]
			for i := range row {
				row[i] += bias[i]
			}
		}
	}
}

// matmulBackward accumulates dIn += dOut·w, dW += dOutᵀ·in, dBias += Σ dOut.
func (m *Model) matmulBackward(dIn, dW, dBias, dOut, in, w []float32, rows, ic, oc int) {
	m.be.Gemm(false, false, rows, ic, oc, 1, dOut, oc, w, ic, 1, dIn, ic)
	m.be.Gemm(true, false, oc, ic, rows, 1, dOut, oc, in, ic, 1, dW, ic)
	if dBias != nil {
		for r := 0; r < rows; r++ {
			row := dOut[r*oc : (r+1)*oc]
			for i, v := range row {
				dBias[i] += v
			}
		}
	}
}

// Forward runs b sequences of t tokens (inputs, b·t token ids) and, if
// targets is not nil, returns the mean cross-entropy loss of predicting
// them. The activations are kept for Backward.
func (m *Model) Forward(inputs, targets []uint32, b, t int) (float32, error) {
	if err := lm.CheckBatch("gpt", inputs, targets, b, t, m.Context, m.Vocab); err != nil {
		return 0, err
	}
	m.ensure(b, t)
	m.inputs, m.targets = inputs, targets
	C, BT, L := m.Width, b*t, m.Layers
	p, a := &m.p, &m.act

	for i, tok := range inputs { // token + position embedding
		pos := i % t
		row := a.encoded[i*C : (i+1)*C]
		te, pe := p.wte[int(tok)*C:(int(tok)+1)*C], p.wpe[pos*C:(pos+1)*C]
		for j := range row {
			row[j] = te[j] + pe[j]
		}
	}
	resid := a.encoded
	for l := 0; l < L; l++ {
		la := &a.layers[l]
		m.be.LayerNorm(la.ln1, la.ln1Mean, la.ln1Rstd, resid, p.ln1w[l*C:(l+1)*C], p.ln1b[l*C:(l+1)*C], BT, C)
		m.matmul(la.qkv, la.ln1, p.qkvw[l*3*C*C:(l+1)*3*C*C], p.qkvb[l*3*C:(l+1)*3*C], BT, C, 3*C)
		m.be.Attention(la.atty, la.att, la.qkv, b, t, C, m.Heads)
		m.matmul(la.attproj, la.atty, p.projw[l*C*C:(l+1)*C*C], p.projb[l*C:(l+1)*C], BT, C, C)
		for i := range la.resid2 {
			la.resid2[i] = resid[i] + la.attproj[i]
		}
		m.be.LayerNorm(la.ln2, la.ln2Mean, la.ln2Rstd, la.resid2, p.ln2w[l*C:(l+1)*C], p.ln2b[l*C:(l+1)*C], BT, C)
		m.matmul(la.fch, la.ln2, p.fcw[l*4*C*C:(l+1)*4*C*C], p.fcb[l*4*C:(l+1)*4*C], BT, C, 4*C)
		m.be.GELU(la.fchGelu, la.fch)
		m.matmul(la.fcproj, la.fchGelu, p.fcprojw[l*4*C*C:(l+1)*4*C*C], p.fcprojb[l*C:(l+1)*C], BT, 4*C, C)
		for i := range la.resid3 {
			la.resid3[i] = la.resid2[i] + la.fcproj[i]
		}
		resid = la.resid3
	}
	m.be.LayerNorm(a.lnf, a.lnfMean, a.lnfRstd, resid, p.lnfw, p.lnfb, BT, C)
	m.matmul(a.logits, a.lnf, p.wte, nil, BT, C, m.Vocab)
	if targets == nil {
		return 0, nil
	}
	m.be.SoftmaxCrossEntropy(a.losses, a.logits, targets, BT, m.Vocab)
	return lm.MeanLoss(a.losses), nil
}

// Logits returns the output of the last Forward without targets (b·t rows of
// vocab logits).
func (m *Model) Logits() []float32 { return m.act.logits }

// Backward adds the gradient of the mean loss of the last Forward (which must
// have had targets) to Grads.
func (m *Model) Backward() error {
	if m.targets == nil {
		return fmt.Errorf("gpt: backward needs a forward pass with targets")
	}
	b, t := m.b, m.t
	C, BT, L := m.Width, b*t, m.Layers
	p, g, a, d := &m.p, &m.g, &m.act, &m.grad
	clearActs(d)

	m.be.CrossEntropyBackward(d.logits, a.logits, m.targets, BT, m.Vocab, 1/float32(BT))
	m.matmulBackward(d.lnf, g.wte, nil, d.logits, a.lnf, p.wte, BT, C, m.Vocab)
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
		for i, v := range dl.resid3 {
			dl.resid2[i] += v
			dl.fcproj[i] += v
		}
		m.matmulBackward(dl.fchGelu, g.fcprojw[l*4*C*C:(l+1)*4*C*C], g.fcprojb[l*C:(l+1)*C], dl.fcproj, la.fchGelu, p.fcprojw[l*4*C*C:(l+1)*4*C*C], BT, 4*C, C)
		m.be.GELUBackward(dl.fch, la.fch, dl.fchGelu)
		m.matmulBackward(dl.ln2, g.fcw[l*4*C*C:(l+1)*4*C*C], g.fcb[l*4*C:(l+1)*4*C], dl.fch, la.ln2, p.fcw[l*4*C*C:(l+1)*4*C*C], BT, C, 4*C)
		m.be.LayerNormBackward(dl.resid2, g.ln2w[l*C:(l+1)*C], g.ln2b[l*C:(l+1)*C], dl.ln2, la.resid2, p.ln2w[l*C:(l+1)*C], la.ln2Mean, la.ln2Rstd, BT, C)
		// resid2 = resid + attproj
		for i, v := range dl.resid2 {
			dResid[i] += v
			dl.attproj[i] += v
		}
		m.matmulBackward(dl.atty, g.projw[l*C*C:(l+1)*C*C], g.projb[l*C:(l+1)*C], dl.attproj, la.atty, p.projw[l*C*C:(l+1)*C*C], BT, C, C)
		m.be.AttentionBackward(dl.qkv, dl.att, dl.atty, la.qkv, la.att, b, t, C, m.Heads)
		m.matmulBackward(dl.ln1, g.qkvw[l*3*C*C:(l+1)*3*C*C], g.qkvb[l*3*C:(l+1)*3*C], dl.qkv, la.ln1, p.qkvw[l*3*C*C:(l+1)*3*C*C], BT, C, 3*C)
		m.be.LayerNormBackward(dResid, g.ln1w[l*C:(l+1)*C], g.ln1b[l*C:(l+1)*C], dl.ln1, resid, p.ln1w[l*C:(l+1)*C], la.ln1Mean, la.ln1Rstd, BT, C)
	}
	for i, tok := range m.inputs {
		pos := i % t
		row := d.encoded[i*C : (i+1)*C]
		te, pe := g.wte[int(tok)*C:(int(tok)+1)*C], g.wpe[pos*C:(pos+1)*C]
		for j, v := range row {
			te[j] += v
			pe[j] += v
		}
	}
	return nil
}

func clearActs(a *activations) {
	clear(a.encoded)
	clear(a.lnf)
	clear(a.logits)
	for l := range a.layers {
		la := &a.layers[l]
		for _, s := range [][]float32{la.ln1, la.qkv, la.atty, la.att, la.attproj, la.resid2, la.ln2, la.fch, la.fchGelu, la.fcproj, la.resid3} {
			clear(s)
		}
	}
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
