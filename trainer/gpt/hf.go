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
	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
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

// HFTensors are the parameters in the Hugging Face layout (copies).
func (m *Model) HFTensors() []checkpoint.Tensor { return lm.Cut(m.HFPieces(), m.Tensors()) }

// HFGradTensors are the gradients in the Hugging Face layout (copies).
func (m *Model) HFGradTensors() []checkpoint.Tensor { return lm.Cut(m.HFPieces(), m.GradTensors()) }

// SaveHF writes the model as a Hugging Face GPT-2 directory: config.json
// and model.safetensors (float32), each written atomically.
func (m *Model) SaveHF(ctx context.Context, dir string) error {
	return SaveHFTensors(ctx, dir, m.Config, m.HFTensors())
}

// SaveHFTensors is SaveHF of a model of config c whose Hugging Face tensors
// (HFPieces) are tensors: their values may come from Fill, so a model held
// elsewhere is written a chunk at a time.
func SaveHFTensors(ctx context.Context, dir string, c Config, tensors []checkpoint.Tensor) error {
	cfg, err := HFConfigJSON(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("gpt: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, HFConfigFile), cfg, 0o644); err != nil {
		return fmt.Errorf("gpt: %w", err)
	}
	return checkpoint.Save(ctx, filepath.Join(dir, HFModelFile), tensors, map[string]string{"format": "pt"})
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
	params := m.Tensors()
	for _, p := range cfg.HFPieces() {
		v, err := ck.Tensor(p.Name, p.Shape)
		if err != nil {
			return nil, fmt.Errorf("gpt: %s: %w", filepath.Join(dir, HFModelFile), err)
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, fmt.Errorf("%w: %s: tensor %s", ErrHFValues, filepath.Join(dir, HFModelFile), p.Name)
			}
		}
		if p.Transposed { // stored in×out: ours is its transpose
			v = modelspec.Transpose(v, p.Shape[0], p.Shape[1])
		}
		copy(params[p.Tensor][p.Offset:], v)
	}
	return m, nil
}
