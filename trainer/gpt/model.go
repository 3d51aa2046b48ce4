package gpt

import (
	"math"

	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// Config is the shape of a model. It is modelspec's, so what a run's
// account says about its model (parameter counts, tensor shapes) is known
// without compiling the model or its kernels.
type Config = modelspec.GPTConfig

// TensorSpec names one parameter tensor.
type TensorSpec = modelspec.TensorSpec

// params are views into one buffer, in Specs order.
type params struct {
	wte, wpe                   []float32
	ln1w, ln1b, qkvw, qkvb     []float32
	projw, projb, ln2w, ln2b   []float32
	fcw, fcb, fcprojw, fcprojb []float32
	lnfw, lnfb                 []float32
}

func views(c Config, buf []float32) (params, [][]float32) {
	var p params
	dst := []*[]float32{&p.wte, &p.wpe, &p.ln1w, &p.ln1b, &p.qkvw, &p.qkvb, &p.projw, &p.projb,
		&p.ln2w, &p.ln2b, &p.fcw, &p.fcb, &p.fcprojw, &p.fcprojb, &p.lnfw, &p.lnfb}
	all := lm.Split(buf, c.Shapes(), dst)
	return p, all
}

// tparams are params as the backend keeps them.
type tparams struct {
	wte, wpe                   kernels.Tensor
	ln1w, ln1b, qkvw, qkvb     kernels.Tensor
	projw, projb, ln2w, ln2b   kernels.Tensor
	fcw, fcb, fcprojw, fcprojb kernels.Tensor
	lnfw, lnfb                 kernels.Tensor
}

func tviews(c Config, buf kernels.Tensor) tparams {
	var p tparams
	lm.SplitTensor(buf, c.Shapes(), []*kernels.Tensor{&p.wte, &p.wpe, &p.ln1w, &p.ln1b, &p.qkvw, &p.qkvb, &p.projw, &p.projb,
		&p.ln2w, &p.ln2b, &p.fcw, &p.fcb, &p.fcprojw, &p.fcprojb, &p.lnfw, &p.lnfb})
	return p
}

// Model is a GPT with its parameters, gradients and the activations of the
// last forward pass (sized for batches of up to B sequences of T tokens).
type Model struct {
	Config
	be kernels.Backend

	lm.Buffers         // Params and Grads, Specs order
	p, g       params  // views of Params and Grads
	dp, dg     tparams // the same on the backend

	b, t int
	act  activations
	grad activations
	head lm.Head
	// inputs and targets of the last forward pass
	inputs, targets []uint32
	positions       []uint32 // each token's position in its sequence
}

// New returns a model with GPT-2 style initial weights drawn from seed:
// N(0, 0.02) for matrices (the residual projections scaled by 1/√(2·layers)),
// zero biases, unit norm weights.
func New(c Config, seed uint64, be kernels.Backend) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if be == nil {
		be = kernels.Default()
	}
	m := &Model{Config: c, be: be}
	m.Buffers, m.p, m.g = lm.NewBuffers(be, c.NumParams(), func(buf []float32) (params, [][]float32) { return views(c, buf) })
	m.dp, m.dg = tviews(c, m.ParamsOnBackend()), tviews(c, m.GradsOnBackend())
	lm.Draw(m.Tensors(), Inits(c), seed, Stream)
	return m, nil
}

// Stream is the PCG stream of the normal draws New takes from its seed.
const Stream = 0x677074

// Inits are how New fills each tensor (Shapes order): N(0, 0.02) for the
// matrices, 0.01 for the position embeddings, the residual projections
// scaled by 1/√(2·layers), zero biases, unit norm weights.
func Inits(c Config) []lm.Init {
	resid := 0.02 / math.Sqrt(2*float64(c.Layers))
	one, zero := lm.Init{Ones: true}, lm.Init{}
	// wte, wpe, ln1 w/b, qkv w/b, proj w/b, ln2 w/b, fc w/b, fcproj w/b, lnf w/b
	return []lm.Init{{Std: 0.02}, {Std: 0.01}, one, zero, {Std: 0.02}, zero, {Std: resid}, zero,
		one, zero, {Std: 0.02}, zero, {Std: resid}, zero, one, zero}
}

// Backend is the kernels implementation the model runs on.
func (m *Model) Backend() kernels.Backend { return m.be }

// Shapes returns the parameter shapes, Specs order.
func (m *Model) Shapes() [][]int { return m.Config.Shapes() }
