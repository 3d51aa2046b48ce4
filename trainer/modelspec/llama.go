package modelspec

import (
	"errors"
	"fmt"
	"math"
)

// DefaultNormEps is RMSNorm's ε when a config does not name one (Llama 2's
// rms_norm_eps).
const DefaultNormEps = 1e-5

// LlamaConfig is the shape of a model.
type LlamaConfig struct {
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
func (c LlamaConfig) HeadDim() int { return c.Width / max(c.Heads, 1) }

// Eps is RMSNorm's ε: NormEps, or DefaultNormEps when that is 0.
func (c LlamaConfig) Eps() float32 {
	if c.NormEps == 0 {
		return DefaultNormEps
	}
	return c.NormEps
}

// Validate checks the shape.
func (c LlamaConfig) Validate() error {
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

// QKVRows is the output width of a layer's fused query/key/value projection.
func (c LlamaConfig) QKVRows() int { return (c.Heads + 2*c.KVHeads) * c.HeadDim() }

// Specs lists the parameter tensors in storage order. The head is last and
// absent when it is tied to the embeddings.
func (c LlamaConfig) Specs() []TensorSpec {
	V, C, L, I := c.Vocab, c.Width, c.Layers, c.Intermediate
	specs := []TensorSpec{
		{"embed", []int{V, C}},
		{"attn_norm.weight", []int{L, C}},
		{"attn.qkv.weight", []int{L, c.QKVRows(), C}},
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
func (c LlamaConfig) NumParams() int { return numParams(c.Shapes()) }

// Shapes lists the parameter shapes, Specs order.
func (c LlamaConfig) Shapes() [][]int {
	var out [][]int
	for _, s := range c.Specs() {
		out = append(out, s.Shape)
	}
	return out
}

// FLOPsPerToken estimates the floating-point operations of one forward and
// backward pass per token: 6 per weight of the matrix products (forward 2,
// backward 4) plus attention's q·k and att·v, about half of them masked.
func (c LlamaConfig) FLOPsPerToken(t int) float64 {
	C, L, I := float64(c.Width), float64(c.Layers), float64(c.Intermediate)
	matmul := 6 * (L*(float64(c.QKVRows())*C+C*C+3*I*C) + float64(c.Vocab)*C)
	attention := 6 * L * float64(t) * C
	return matmul + attention
}
