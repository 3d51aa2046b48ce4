package gpt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/psyche-go/psyche/internal/atomicfile"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// The Hugging Face layout of a GPT is GPT-2's (transformers'
// GPT2LMHeadModel): config.json and model.safetensors with tensors named
// transformer.wte.weight, transformer.h.N.attn.c_attn.weight and so on. Its
// linear layers are "Conv1D": the weight is stored input-major (in×out), the
// transpose of ours (out×in), so those four matrices are transposed each
// way. The output head is the token embedding (tie_word_embeddings), and the
// model is what ours computes: pre-norm blocks, LayerNorm ε 1e-5, GELU's
// tanh form ("gelu_new"), attention scaled by 1/√(head size), an MLP of
// 4·width.

// layerNormEpsilon is the kernels' LayerNorm ε, which GPT-2 shares.
const layerNormEpsilon = kernels.LayerNormEps

// HF file names.
const (
	HFConfigFile = "config.json"
	HFModelFile  = "model.safetensors"
)

// ErrHFConfig marks a config.json that is not a GPT this package computes.
var ErrHFConfig = errors.New("gpt: not a GPT-2 this model computes")

// ErrHFValues marks a GPT-2 checkpoint holding a value that is not finite.
var ErrHFValues = errors.New("gpt: a tensor holds a value that is not finite")

type hfConfig struct {
	Architectures        []string `json:"architectures"`
	ModelType            string   `json:"model_type"`
	VocabSize            int      `json:"vocab_size"`
	NPositions           int      `json:"n_positions"`
	NCtx                 int      `json:"n_ctx,omitempty"`
	NEmbd                int      `json:"n_embd"`
	NLayer               int      `json:"n_layer"`
	NHead                int      `json:"n_head"`
	NInner               *int     `json:"n_inner"`
	ActivationFunction   string   `json:"activation_function"`
	LayerNormEpsilon     float64  `json:"layer_norm_epsilon"`
	TieWordEmbeddings    *bool    `json:"tie_word_embeddings,omitempty"`
	ScaleAttnWeights     *bool    `json:"scale_attn_weights,omitempty"`
	ScaleByLayerIdx      bool     `json:"scale_attn_by_inverse_layer_idx"`
	ReorderAndUpcastAttn bool     `json:"reorder_and_upcast_attn"`
	ResidPdrop           float64  `json:"resid_pdrop"`
	EmbdPdrop            float64  `json:"embd_pdrop"`
	AttnPdrop            float64  `json:"attn_pdrop"`
	InitializerRange     float64  `json:"initializer_range"`
	TorchDType           string   `json:"torch_dtype,omitempty"`
}

// HFConfigJSON is config.json for this shape.
func HFConfigJSON(c Config) ([]byte, error) {
	yes := true
	h := hfConfig{Architectures: []string{"GPT2LMHeadModel"}, ModelType: "gpt2", VocabSize: c.Vocab, NPositions: c.Context,
		NCtx: c.Context, NEmbd: c.Width, NLayer: c.Layers, NHead: c.Heads, ActivationFunction: "gelu_new",
		LayerNormEpsilon: layerNormEpsilon, TieWordEmbeddings: &yes, ScaleAttnWeights: &yes, InitializerRange: 0.02,
		TorchDType: "float32"}
	b, err := json.MarshalIndent(h, "", "  ")
	return append(b, '\n'), err
}

// ParseHFConfig reads a GPT-2 config.json (named file in errors), refusing
// what this model does not compute.
func ParseHFConfig(file string, b []byte) (Config, error) {
	fail := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: %s: "+format, append([]any{ErrHFConfig, file}, args...)...)
	}
	// transformers' GPT2Config defaults for what a config may leave out.
	h := hfConfig{ActivationFunction: "gelu_new", LayerNormEpsilon: 1e-5}
	if err := json.Unmarshal(b, &h); err != nil {
		return fail("%v", err)
	}
	c := Config{Vocab: h.VocabSize, Context: h.NPositions, Width: h.NEmbd, Layers: h.NLayer, Heads: h.NHead}
	switch {
	case h.ModelType != "gpt2":
		return fail("model_type %q, want \"gpt2\"", h.ModelType)
	case h.ActivationFunction != "gelu_new" && h.ActivationFunction != "gelu_pytorch_tanh":
		return fail("activation_function %q: this GPT computes GELU's tanh form (gelu_new)", h.ActivationFunction)
	case h.NInner != nil && *h.NInner != 4*h.NEmbd:
		return fail("n_inner %d: this GPT's MLP is 4·n_embd (%d)", *h.NInner, 4*h.NEmbd)
	case math.Abs(h.LayerNormEpsilon-layerNormEpsilon) > 1e-12:
		return fail("layer_norm_epsilon %g: this GPT's is %g", h.LayerNormEpsilon, layerNormEpsilon)
	case h.TieWordEmbeddings != nil && !*h.TieWordEmbeddings:
		return fail("tie_word_embeddings false: this GPT's output head is its token embedding")
	case h.ScaleAttnWeights != nil && !*h.ScaleAttnWeights, h.ScaleByLayerIdx, h.ReorderAndUpcastAttn:
		return fail("attention scaled otherwise than by 1/√(head size)")
	}
	if err := c.Validate(); err != nil {
		return fail("%v", err)
	}
	return c, nil
}

// hfName is the Hugging Face name of layer l's tensor suffix.
func hfName(l int, suffix string) string { return fmt.Sprintf("transformer.h.%d.%s", l, suffix) }

// transposed is the cols×rows transpose of a rows×cols matrix.
func transposed(m []float32, rows, cols int) []float32 {
	out := make([]float32, len(m))
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			out[c*rows+r] = m[r*cols+c]
		}
	}
	return out
}

// hfTensors are p's tensors in the Hugging Face layout (copies: the
// linear weights are transposed).
func (m *Model) hfTensors(p params) []checkpoint.Tensor {
	C, L := m.Width, m.Layers
	out := []checkpoint.Tensor{
		{Name: "transformer.wte.weight", Shape: []int{m.Vocab, C}, Data: p.wte},
		{Name: "transformer.wpe.weight", Shape: []int{m.Context, C}, Data: p.wpe},
	}
	for l := 0; l < L; l++ {
		vec := func(v []float32, n int) []float32 { return v[l*n : (l+1)*n] }
		// Ours: out×in per layer; GPT-2's Conv1D: in×out.
		lin := func(w []float32, out, in int) []float32 { return transposed(w[l*out*in:(l+1)*out*in], out, in) }
		out = append(out,
			checkpoint.Tensor{Name: hfName(l, "ln_1.weight"), Shape: []int{C}, Data: vec(p.ln1w, C)},
			checkpoint.Tensor{Name: hfName(l, "ln_1.bias"), Shape: []int{C}, Data: vec(p.ln1b, C)},
			checkpoint.Tensor{Name: hfName(l, "attn.c_attn.weight"), Shape: []int{C, 3 * C}, Data: lin(p.qkvw, 3*C, C)},
			checkpoint.Tensor{Name: hfName(l, "attn.c_attn.bias"), Shape: []int{3 * C}, Data: vec(p.qkvb, 3*C)},
			checkpoint.Tensor{Name: hfName(l, "attn.c_proj.weight"), Shape: []int{C, C}, Data: lin(p.projw, C, C)},
			checkpoint.Tensor{Name: hfName(l, "attn.c_proj.bias"), Shape: []int{C}, Data: vec(p.projb, C)},
			checkpoint.Tensor{Name: hfName(l, "ln_2.weight"), Shape: []int{C}, Data: vec(p.ln2w, C)},
			checkpoint.Tensor{Name: hfName(l, "ln_2.bias"), Shape: []int{C}, Data: vec(p.ln2b, C)},
			checkpoint.Tensor{Name: hfName(l, "mlp.c_fc.weight"), Shape: []int{C, 4 * C}, Data: lin(p.fcw, 4*C, C)},
			checkpoint.Tensor{Name: hfName(l, "mlp.c_fc.bias"), Shape: []int{4 * C}, Data: vec(p.fcb, 4*C)},
			checkpoint.Tensor{Name: hfName(l, "mlp.c_proj.weight"), Shape: []int{4 * C, C}, Data: lin(p.fcprojw, C, 4*C)},
			checkpoint.Tensor{Name: hfName(l, "mlp.c_proj.bias"), Shape: []int{C}, Data: vec(p.fcprojb, C)},
		)
	}
	return append(out,
		checkpoint.Tensor{Name: "transformer.ln_f.weight", Shape: []int{C}, Data: p.lnfw},
		checkpoint.Tensor{Name: "transformer.ln_f.bias", Shape: []int{C}, Data: p.lnfb})
}

// HFTensors are the parameters in the Hugging Face layout (copies).
func (m *Model) HFTensors() []checkpoint.Tensor { return m.hfTensors(m.p) }

// HFGradTensors are the gradients in the Hugging Face layout (copies).
func (m *Model) HFGradTensors() []checkpoint.Tensor { return m.hfTensors(m.g) }

// SaveHF writes the model as a Hugging Face GPT-2 directory: config.json
// and model.safetensors (float32), each written atomically.
func (m *Model) SaveHF(ctx context.Context, dir string) error {
	cfg, err := HFConfigJSON(m.Config)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("gpt: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, HFConfigFile), cfg, 0o644); err != nil {
		return fmt.Errorf("gpt: %w", err)
	}
	return checkpoint.Save(ctx, filepath.Join(dir, HFModelFile), m.HFTensors(), map[string]string{"format": "pt"})
}

// IsHFDir says whether dir's config.json describes a GPT-2.
func IsHFDir(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, HFConfigFile))
	if err != nil {
		return false
	}
	var h struct {
		ModelType string `json:"model_type"`
	}
	return json.Unmarshal(b, &h) == nil && h.ModelType == "gpt2"
}

// LoadHF builds the model a Hugging Face GPT-2 directory holds
// (config.json, model.safetensors), refusing a config this model does not
// compute and tensors that are missing, misshapen or not finite. accept, if
// not nil, may refuse the config before the model is allocated.
func LoadHF(dir string, be kernels.Backend, accept func(Config) error) (*Model, error) {
	b, err := os.ReadFile(filepath.Join(dir, HFConfigFile))
	if err != nil {
		return nil, fmt.Errorf("gpt: %w", err)
	}
	cfg, err := ParseHFConfig(filepath.Join(dir, HFConfigFile), b)
	if err != nil {
		return nil, err
	}
	if accept != nil {
		if err := accept(cfg); err != nil {
			return nil, err
		}
	}
	lim := checkpoint.Limits{MaxDataSize: 4 * int64(cfg.NumParams()), MaxHeaderSize: checkpoint.HeaderLimit(cfg.Layers)}
	ck, err := lim.Load(filepath.Join(dir, HFModelFile))
	if err != nil {
		return nil, err
	}
	m, err := New(cfg, 0, be)
	if err != nil {
		return nil, err
	}
	C, L := cfg.Width, cfg.Layers
	take := func(name string, shape []int, dst []float32, transpose bool) error {
		v, err := ck.Tensor(name, shape)
		if err != nil {
			return fmt.Errorf("gpt: %s: %w", filepath.Join(dir, HFModelFile), err)
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("%w: %s: tensor %s", ErrHFValues, filepath.Join(dir, HFModelFile), name)
			}
		}
		if transpose { // stored in×out: ours is its transpose
			v = transposed(v, shape[0], shape[1])
		}
		copy(dst, v)
		return nil
	}
	p := m.p
	steps := []func() error{
		func() error { return take("transformer.wte.weight", []int{cfg.Vocab, C}, p.wte, false) },
		func() error { return take("transformer.wpe.weight", []int{cfg.Context, C}, p.wpe, false) },
		func() error { return take("transformer.ln_f.weight", []int{C}, p.lnfw, false) },
		func() error { return take("transformer.ln_f.bias", []int{C}, p.lnfb, false) },
	}
	for l := 0; l < L; l++ {
		at := func(v []float32, n int) []float32 { return v[l*n : (l+1)*n] }
		steps = append(steps,
			func() error { return take(hfName(l, "ln_1.weight"), []int{C}, at(p.ln1w, C), false) },
			func() error { return take(hfName(l, "ln_1.bias"), []int{C}, at(p.ln1b, C), false) },
			func() error { return take(hfName(l, "attn.c_attn.weight"), []int{C, 3 * C}, at(p.qkvw, 3*C*C), true) },
			func() error { return take(hfName(l, "attn.c_attn.bias"), []int{3 * C}, at(p.qkvb, 3*C), false) },
			func() error { return take(hfName(l, "attn.c_proj.weight"), []int{C, C}, at(p.projw, C*C), true) },
			func() error { return take(hfName(l, "attn.c_proj.bias"), []int{C}, at(p.projb, C), false) },
			func() error { return take(hfName(l, "ln_2.weight"), []int{C}, at(p.ln2w, C), false) },
			func() error { return take(hfName(l, "ln_2.bias"), []int{C}, at(p.ln2b, C), false) },
			func() error { return take(hfName(l, "mlp.c_fc.weight"), []int{C, 4 * C}, at(p.fcw, 4*C*C), true) },
			func() error { return take(hfName(l, "mlp.c_fc.bias"), []int{4 * C}, at(p.fcb, 4*C), false) },
			func() error { return take(hfName(l, "mlp.c_proj.weight"), []int{4 * C, C}, at(p.fcprojw, 4*C*C), true) },
			func() error { return take(hfName(l, "mlp.c_proj.bias"), []int{C}, at(p.fcprojb, C), false) },
		)
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, err
		}
	}
	return m, nil
}
