package llama

import (
	"math"

	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// DefaultNormEps is RMSNorm's ε when a config does not name one (Llama 2's
// rms_norm_eps).
const DefaultNormEps = modelspec.DefaultNormEps

// Config is the shape of a model. It is modelspec's, so what a run's
// account says about its model (parameter counts, tensor shapes) is known
// without compiling the model or its kernels.
type Config = modelspec.LlamaConfig

// TensorSpec names one parameter tensor.
type TensorSpec = modelspec.TensorSpec

// params are views into one buffer, in Specs order; head aliases embed when
// the head is tied.
type params struct {
	embed, attnNorm, qkv, o, mlpNorm, gateUp, down, norm, head []float32
}

func views(c Config, buf []float32) (params, [][]float32) {
	var p params
	dst := []*[]float32{&p.embed, &p.attnNorm, &p.qkv, &p.o, &p.mlpNorm, &p.gateUp, &p.down, &p.norm, &p.head}
	all := lm.Split(buf, c.Shapes(), dst)
	if c.TiedHead {
		p.head = p.embed
	}
	return p, all
}

// Model is a Llama with its parameters, gradients and the activations of the
// last forward pass.
type Model struct {
	Config
	be kernels.Backend

	lm.Buffers         // Params and Grads, Specs order
	p, g       params  // views of Params and Grads
	dp, dg     tparams // the same on the backend

	b, t            int
	act, grad       activations
	head            lm.Head
	inputs, targets []uint32
}

// tparams are params as the backend keeps them.
type tparams struct {
	embed, attnNorm, qkv, o, mlpNorm, gateUp, down, norm, head kernels.Tensor
}

func tviews(c Config, buf kernels.Tensor) tparams {
	var p tparams
	lm.SplitTensor(buf, c.Shapes(), []*kernels.Tensor{&p.embed, &p.attnNorm, &p.qkv, &p.o, &p.mlpNorm, &p.gateUp, &p.down, &p.norm, &p.head})
	if c.TiedHead {
		p.head = p.embed
	}
	return p
}

// New returns a model with initial weights drawn from seed: N(0, 0.02) for
// the embeddings, projections and head (Hugging Face's initializer_range),
// the two projections back into the residual stream (attention output and
// MLP down) scaled by 1/√(2·layers) as GPT-2 does so the residual stream's
// variance does not grow with depth, and unit norm weights.
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
const Stream = 0x6c6c616d61

// Inits are how New fills each tensor (Shapes order): N(0, 0.02) for the
// embeddings, projections and head, the two projections back into the
// residual stream scaled by 1/√(2·layers), unit norm weights.
func Inits(c Config) []lm.Init {
	resid := 0.02 / math.Sqrt(2*float64(c.Layers))
	in := []lm.Init{{Std: 0.02}, {Ones: true}, {Std: 0.02}, {Std: resid}, {Ones: true}, {Std: 0.02}, {Std: resid}, {Ones: true}}
	if !c.TiedHead {
		in = append(in, lm.Init{Std: 0.02})
	}
	return in
}

// Backend is the kernels implementation the model runs on.
func (m *Model) Backend() kernels.Backend { return m.be }

// Shapes returns the parameter shapes, Specs order.
func (m *Model) Shapes() [][]int { return m.Config.Shapes() }
