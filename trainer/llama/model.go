package llama

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// DefaultNormEps is RMSNorm's ε when a config does not name one (Llama 2's
// rms_norm_eps).
const DefaultNormEps = 1e-5

// Config is the shape of a model.
type Config struct {
	Vocab        int     // tokens
	Context      int     // maximum sequence length
	Width        int     // hidden size (d_model)
	Layers       int     // decoder blocks
	Heads        int     // query heads; must divide Width into even head sizes
	KVHeads      int     // key/value heads; must divide Heads (Heads: plain multi-head attention)
	Intermediate int     // the MLP's hidden size
	RopeTheta    float32 // rotary base θ (10000 for Llama 2, 500000 for Llama 3)
	TiedHead     bool    // the output head is the embedding matrix
	NormEps      float32 // RMSNorm ε; 0 means DefaultNormEps
}

// HeadDim is the width of one attention head.
func (c Config) HeadDim() int { return c.Width / max(c.Heads, 1) }

func (c Config) eps() float32 {
	if c.NormEps == 0 {
		return DefaultNormEps
	}
	return c.NormEps
}

// Validate checks the shape.
func (c Config) Validate() error {
	var errs []error
	rule := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("llama: "+format, args...))
		}
	}
	rule(c.Vocab > 0 && c.Context > 0 && c.Width > 0 && c.Layers > 0 && c.Intermediate > 0,
		"vocab, context, width, layers and intermediate size must be positive: %+v", c)
	rule(c.Heads > 0 && c.Width%max(c.Heads, 1) == 0 && c.HeadDim()%2 == 0,
		"heads (%d) must divide width (%d) into heads of an even size (rotary embeddings turn pairs)", c.Heads, c.Width)
	rule(c.KVHeads > 0 && c.KVHeads <= c.Heads && c.Heads%max(c.KVHeads, 1) == 0,
		"kv heads (%d) must be positive and divide heads (%d)", c.KVHeads, c.Heads)
	rule(c.RopeTheta > 1 && !math.IsInf(float64(c.RopeTheta), 0), "rope theta (%g) must be finite and greater than 1", c.RopeTheta)
	rule(c.NormEps >= 0 && c.NormEps < 1, "norm eps (%g) must be in [0, 1)", c.NormEps)
	return errors.Join(errs...)
}

// TensorSpec names one parameter tensor.
type TensorSpec struct {
	Name  string
	Shape []int
}

// qkvRows is the output width of a layer's fused query/key/value projection.
func (c Config) qkvRows() int { return (c.Heads + 2*c.KVHeads) * c.HeadDim() }

// Specs lists the parameter tensors in storage order. The head is last and
// absent when it is tied to the embeddings.
func (c Config) Specs() []TensorSpec {
	V, C, L, I := c.Vocab, c.Width, c.Layers, c.Intermediate
	specs := []TensorSpec{
		{"embed", []int{V, C}},
		{"attn_norm.weight", []int{L, C}},
		{"attn.qkv.weight", []int{L, c.qkvRows(), C}},
		{"attn.o.weight", []int{L, C, C}},
		{"mlp_norm.weight", []int{L, C}},
		{"mlp.gate_up.weight", []int{L, 2 * I, C}},
		{"mlp.down.weight", []int{L, C, I}},
		{"norm.weight", []int{C}},
	}
	if !c.TiedHead {
		specs = append(specs, TensorSpec{"head.weight", []int{V, C}})
	}
	return specs
}

// NumParams is the number of parameters.
func (c Config) NumParams() int { return lm.NumParams(c.shapes()) }

// params are views into one buffer, in Specs order; head aliases embed when
// the head is tied.
type params struct {
	embed, attnNorm, qkv, o, mlpNorm, gateUp, down, norm, head []float32
}

func (c Config) views(buf []float32) (params, [][]float32) {
	var p params
	dst := []*[]float32{&p.embed, &p.attnNorm, &p.qkv, &p.o, &p.mlpNorm, &p.gateUp, &p.down, &p.norm, &p.head}
	all := lm.Split(buf, c.shapes(), dst)
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

func (c Config) tviews(buf kernels.Tensor) tparams {
	var p tparams
	lm.SplitTensor(buf, c.shapes(), []*kernels.Tensor{&p.embed, &p.attnNorm, &p.qkv, &p.o, &p.mlpNorm, &p.gateUp, &p.down, &p.norm, &p.head})
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
	m.Buffers, m.p, m.g = lm.NewBuffers(be, c.NumParams(), c.views)
	m.dp, m.dg = c.tviews(m.ParamsOnBackend()), c.tviews(m.GradsOnBackend())
	r := rand.New(rand.NewPCG(seed, 0x6c6c616d61))
	normal := func(v []float32, std float64) { lm.Normal(r, v, std) }
	ones := lm.Ones
	resid := 0.02 / math.Sqrt(2*float64(c.Layers))
	normal(m.p.embed, 0.02)
	ones(m.p.attnNorm)
	normal(m.p.qkv, 0.02)
	normal(m.p.o, resid)
	ones(m.p.mlpNorm)
	normal(m.p.gateUp, 0.02)
	normal(m.p.down, resid)
	ones(m.p.norm)
	if !c.TiedHead {
		normal(m.p.head, 0.02)
	}
	return m, nil
}

// Backend is the kernels implementation the model runs on.
func (m *Model) Backend() kernels.Backend { return m.be }

// Shapes returns the parameter shapes, Specs order.
func (m *Model) Shapes() [][]int { return m.shapes() }

// shapes lists the parameter shapes, Specs order.
func (c Config) shapes() [][]int {
	var out [][]int
	for _, s := range c.Specs() {
		out = append(out, s.Shape)
	}
	return out
}
