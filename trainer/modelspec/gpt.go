package modelspec

import (
	"errors"
	"fmt"
)

// GPTConfig is the shape of a model.
type GPTConfig struct {
	Vocab   int // tokens (256 for the byte tokenizer)
	Context int // maximum sequence length
	Width   int // d_model
	Layers  int
	Heads   int // must divide Width
}

// Validate checks the shape.
func (c GPTConfig) Validate() error {
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
func (c GPTConfig) Specs() []TensorSpec {
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
func (c GPTConfig) NumParams() int { return numParams(c.Shapes()) }

// Shapes lists the parameter shapes, Specs order.
func (c GPTConfig) Shapes() [][]int {
	var out [][]int
	for _, s := range c.Specs() {
		out = append(out, s.Shape)
	}
	return out
}

// FLOPsPerToken estimates the floating-point operations of one forward and
// backward pass per token (6 per parameter for the matrix products, plus
// attention): the figure tokens/s is turned into GFLOP/s with.
func (c GPTConfig) FLOPsPerToken(t int) float64 {
	C, L := float64(c.Width), float64(c.Layers)
	matmul := 6 * (L*12*C*C + float64(c.Vocab)*C)
	attention := 6 * L * float64(t) * C // q·k and att·v, forward and backward, about half masked
	return matmul + attention
}
