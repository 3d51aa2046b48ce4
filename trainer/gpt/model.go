package gpt

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// Config is the shape of a model.
type Config struct {
	Vocab   int // tokens (256 for the byte tokenizer)
	Context int // maximum sequence length
	Width   int // d_model
	Layers  int
	Heads   int // must divide Width
}

// Validate checks the shape.
func (c Config) Validate() error {
	var errs []error
	if c.Vocab <= 0 || c.Context <= 0 || c.Width <= 0 || c.Layers <= 0 || c.Heads <= 0 {
		errs = append(errs, fmt.Errorf("gpt: vocab, context, width, layers and heads must be positive: %+v", c))
	}
	if c.Heads > 0 && c.Width%c.Heads != 0 {
		errs = append(errs, fmt.Errorf("gpt: heads (%d) must divide width (%d)", c.Heads, c.Width))
	}
	return errors.Join(errs...)
}

// TensorSpec names one parameter tensor.
type TensorSpec struct {
	Name  string
	Shape []int
}

// Specs lists the parameter tensors in storage order.
func (c Config) Specs() []TensorSpec {
	V, T, C, L := c.Vocab, c.Context, c.Width, c.Layers
	return []TensorSpec{
		{"wte", []int{V, C}},
		{"wpe", []int{T, C}},
		{"ln1.weight", []int{L, C}},
		{"ln1.bias", []int{L, C}},
		{"attn.qkv.weight", []int{L, 3 * C, C}},
		{"attn.qkv.bias", []int{L, 3 * C}},
		{"attn.proj.weight", []int{L, C, C}},
		{"attn.proj.bias", []int{L, C}},
		{"ln2.weight", []int{L, C}},
		{"ln2.bias", []int{L, C}},
		{"mlp.fc.weight", []int{L, 4 * C, C}},
		{"mlp.fc.bias", []int{L, 4 * C}},
		{"mlp.proj.weight", []int{L, C, 4 * C}},
		{"mlp.proj.bias", []int{L, C}},
		{"lnf.weight", []int{C}},
		{"lnf.bias", []int{C}},
	}
}

// NumParams is the number of parameters.
func (c Config) NumParams() int { return lm.NumParams(c.shapes()) }

// params are views into one buffer, in Specs order.
type params struct {
	wte, wpe                   []float32
	ln1w, ln1b, qkvw, qkvb     []float32
	projw, projb, ln2w, ln2b   []float32
	fcw, fcb, fcprojw, fcprojb []float32
	lnfw, lnfb                 []float32
}

func (c Config) views(buf []float32) (params, [][]float32) {
	var p params
	dst := []*[]float32{&p.wte, &p.wpe, &p.ln1w, &p.ln1b, &p.qkvw, &p.qkvb, &p.projw, &p.projb,
		&p.ln2w, &p.ln2b, &p.fcw, &p.fcb, &p.fcprojw, &p.fcprojb, &p.lnfw, &p.lnfb}
	all := lm.Split(buf, c.shapes(), dst)
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

func (c Config) tviews(buf kernels.Tensor) tparams {
	var p tparams
	lm.SplitTensor(buf, c.shapes(), []*kernels.Tensor{&p.wte, &p.wpe, &p.ln1w, &p.ln1b, &p.qkvw, &p.qkvb, &p.projw, &p.projb,
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
	m.Buffers, m.p, m.g = lm.NewBuffers(be, c.NumParams(), c.views)
	m.dp, m.dg = c.tviews(m.ParamsOnBackend()), c.tviews(m.GradsOnBackend())
	r := rand.New(rand.NewPCG(seed, 0x677074))
	normal := func(v []float32, std float64) { lm.Normal(r, v, std) }
	ones := lm.Ones
	resid := 0.02 / math.Sqrt(2*float64(c.Layers))
	normal(m.p.wte, 0.02)
	normal(m.p.wpe, 0.01)
	ones(m.p.ln1w)
	ones(m.p.ln2w)
	ones(m.p.lnfw)
	normal(m.p.qkvw, 0.02)
	normal(m.p.projw, resid)
	normal(m.p.fcw, 0.02)
	normal(m.p.fcprojw, resid)
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
