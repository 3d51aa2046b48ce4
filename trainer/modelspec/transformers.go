package modelspec

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
)

// ErrTransformersConfig means a Hugging Face config.json cannot describe a
// run's model.
var ErrTransformersConfig = errors.New("modelspec: transformers config")

// TransformersConfig is the shape of a Hugging Face transformers causal LM
// as the run's account mirrors it: the account has no room for a
// config.json, so it keeps these fields (for explorers and the checks
// below) and names the file in its checkpoint source (ConfigHash is its
// revision). Everything else the model computes with is in the file.
type TransformersConfig struct {
	Vocab   int // the config's vocab_size
	Context int // the run's max_seq_len (at most the config's positions)
	Width   int // hidden_size
	Layers  int // num_hidden_layers
	Heads   int // num_attention_heads
}

// TransformersFile is what psyche reads from a config.json; the PyTorch
// worker reads the rest with transformers itself.
type TransformersFile struct {
	ModelType    string // model_type: the transformers family (qwen3, gemma3_text, mistral…)
	Vocab        int
	Width        int
	Layers       int
	Heads        int
	MaxPositions int // max_position_embeddings (0: the config sets none)
}

// configKeys are the names families give each field, most common first
// (GPT-2 and its kin spell them n_embd, n_layer, n_head, n_positions).
var configKeys = map[string][]string{
	"vocab_size":    {"vocab_size"},
	"hidden_size":   {"hidden_size", "n_embd", "d_model"},
	"layers":        {"num_hidden_layers", "n_layer", "num_layers"},
	"heads":         {"num_attention_heads", "n_head", "num_heads"},
	"max_positions": {"max_position_embeddings", "n_positions", "n_ctx"},
}

// ParseTransformersFile reads a config.json. Families nest a causal LM's
// config under text_config (Gemma 3's multimodal configs): that one is read
// when the top level has no vocab_size. Every missing or impossible field
// is reported, wrapping ErrTransformersConfig.
func ParseTransformersFile(data []byte) (TransformersFile, error) {
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return TransformersFile{}, fmt.Errorf("%w: not JSON: %v", ErrTransformersConfig, err)
	}
	if tc, ok := raw["text_config"].(map[string]any); ok && raw["vocab_size"] == nil {
		raw = tc
	}
	var errs []error
	var f TransformersFile
	f.ModelType, _ = raw["model_type"].(string)
	if f.ModelType == "" {
		errs = append(errs, fmt.Errorf("%w: model_type is missing (transformers needs it to pick the family)", ErrTransformersConfig))
	}
	field := func(name string, required bool) int {
		for _, k := range configKeys[name] {
			v, ok := raw[k]
			if !ok || v == nil {
				continue
			}
			n, ok := v.(float64)
			if !ok || n < 1 || n != float64(int64(n)) || n > 1<<31 {
				errs = append(errs, fmt.Errorf("%w: %s = %v: want a positive integer", ErrTransformersConfig, k, v))
				return 0
			}
			return int(n)
		}
		if required {
			errs = append(errs, fmt.Errorf("%w: %s is missing", ErrTransformersConfig, strings.Join(configKeys[name], " or ")))
		}
		return 0
	}
	f.Vocab = field("vocab_size", true)
	f.Width = field("hidden_size", true)
	f.Layers = field("layers", true)
	f.Heads = field("heads", true)
	f.MaxPositions = field("max_positions", false)
	if archs, ok := raw["architectures"].([]any); ok {
		for _, a := range archs {
			if s, _ := a.(string); s != "" && !strings.HasSuffix(s, "ForCausalLM") && !strings.HasSuffix(s, "LMHeadModel") {
				errs = append(errs, fmt.Errorf("%w: architectures names %s, not a causal LM", ErrTransformersConfig, s))
			}
		}
	}
	return f, errors.Join(errs...)
}

// Mirror is the account's mirror of the file for a run of context tokens
// per sequence, failing when the model cannot take that many positions.
func (f TransformersFile) Mirror(context int) (TransformersConfig, error) {
	if f.MaxPositions != 0 && context > f.MaxPositions {
		return TransformersConfig{}, fmt.Errorf("%w: max_seq_len %d exceeds the config's %d positions", ErrTransformersConfig, context, f.MaxPositions)
	}
	return TransformersConfig{Vocab: f.Vocab, Context: context, Width: f.Width, Layers: f.Layers, Heads: f.Heads}, nil
}

// ConfigHash is a config.json's revision: the first 16 bytes of its
// SHA-256 as 32 lowercase hex digits, the form of a model hash (a trainer
// checks it against the file it reads, so every trainer builds the model
// from the same bytes).
func ConfigHash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:coordinator.RevisionLen/2])
}

// Transformers is the Transformers config the run describes, failing
// (wrapping ErrArchitecture) for another architecture.
func Transformers(m *coordinator.Model) (TransformersConfig, error) {
	if m.Architecture != coordinator.ArchTransformers {
		return TransformersConfig{}, fmt.Errorf("%w: %d is not %d, Transformers", ErrArchitecture, m.Architecture, coordinator.ArchTransformers)
	}
	c := TransformersConfig{Vocab: int(m.VocabSize), Context: int(m.MaxSeqLen), Width: int(m.DModel), Layers: int(m.NLayers), Heads: int(m.NHeads)}
	if c.Vocab < 1 || c.Context < 1 || c.Width < 1 || c.Layers < 1 || c.Heads < 1 {
		return TransformersConfig{}, fmt.Errorf("modelspec: the run's model: a transformers model needs vocab_size, max_seq_len, d_model, n_layers and n_heads")
	}
	return c, nil
}

// SetTransformers writes c into the architecture and shape fields of m.
func SetTransformers(m *coordinator.Model, c TransformersConfig) {
	m.Architecture = coordinator.ArchTransformers
	m.VocabSize, m.MaxSeqLen = uint32(c.Vocab), uint32(c.Context)
	m.DModel, m.NLayers, m.NHeads = uint32(c.Width), uint32(c.Layers), uint32(c.Heads)
	m.NKVHeads, m.IntermediateSize, m.RopeTheta, m.TiedHead = 0, 0, 0, false
}

// compareTransformers reports every field of c that differs from want.
func compareTransformers(c, want TransformersConfig) error {
	var errs []error
	diff := func(field string, got, want int) {
		if got != want {
			errs = append(errs, fmt.Errorf("%w: %s is %d in the model, %d in the run", ErrMismatch, field, got, want))
		}
	}
	diff("vocab_size", c.Vocab, want.Vocab)
	diff("max_seq_len", c.Context, want.Context)
	diff("d_model", c.Width, want.Width)
	diff("n_layers", c.Layers, want.Layers)
	diff("n_heads", c.Heads, want.Heads)
	return errors.Join(errs...)
}
