package modelspec

import (
	"errors"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

func TestParseTransformersFile(t *testing.T) {
	for _, tt := range []struct {
		name, json string
		want       TransformersFile
		errs       []string // each must appear in the error; none: no error
	}{
		{"qwen3", `{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"vocab_size":256,"hidden_size":64,
			"num_hidden_layers":2,"num_attention_heads":4,"max_position_embeddings":128}`,
			TransformersFile{ModelType: "qwen3", Vocab: 256, Width: 64, Layers: 2, Heads: 4, MaxPositions: 128}, nil},
		{"gpt2 names", `{"model_type":"gpt2","vocab_size":256,"n_embd":32,"n_layer":1,"n_head":2,"n_positions":64}`,
			TransformersFile{ModelType: "gpt2", Vocab: 256, Width: 32, Layers: 1, Heads: 2, MaxPositions: 64}, nil},
		{"nested text_config", `{"model_type":"gemma3","text_config":{"model_type":"gemma3_text","vocab_size":256,
			"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":2}}`,
			TransformersFile{ModelType: "gemma3_text", Vocab: 256, Width: 64, Layers: 2, Heads: 2}, nil},
		{"no model_type", `{"vocab_size":256,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4}`,
			TransformersFile{}, []string{"model_type is missing"}},
		{"missing and bad fields", `{"model_type":"llama","vocab_size":0,"hidden_size":64.5}`,
			TransformersFile{}, []string{"vocab_size = 0", "hidden_size = 64.5", "num_hidden_layers or n_layer or num_layers is missing",
				"num_attention_heads or n_head or num_heads is missing"}},
		{"not causal", `{"model_type":"bert","architectures":["BertForMaskedLM"],"vocab_size":256,"hidden_size":64,
			"num_hidden_layers":2,"num_attention_heads":4}`, TransformersFile{}, []string{"BertForMaskedLM, not a causal LM"}},
		{"not json", `{"model_type":`, TransformersFile{}, []string{"not JSON"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTransformersFile([]byte(tt.json))
			if len(tt.errs) == 0 {
				if err != nil || got != tt.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrTransformersConfig) {
				t.Fatalf("err = %v, want ErrTransformersConfig", err)
			}
			for _, e := range tt.errs {
				if !strings.Contains(err.Error(), e) {
					t.Errorf("err = %v, want it to mention %q", err, e)
				}
			}
		})
	}
}

func TestTransformersMirror(t *testing.T) {
	f := TransformersFile{ModelType: "qwen3", Vocab: 256, Width: 64, Layers: 2, Heads: 4, MaxPositions: 128}
	c, err := f.Mirror(64)
	if err != nil || c != (TransformersConfig{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4}) {
		t.Fatalf("Mirror(64) = %+v, %v", c, err)
	}
	if _, err := f.Mirror(129); !errors.Is(err, ErrTransformersConfig) {
		t.Fatalf("Mirror(129) = %v, want ErrTransformersConfig", err)
	}
	var m coordinator.Model
	SetTransformers(&m, c)
	got, err := ModelConfig(&m)
	if err != nil || got != (Config{Arch: coordinator.ArchTransformers, Transformers: c}) {
		t.Fatalf("ModelConfig = %+v, %v", got, err)
	}
	if got.Context() != 64 || got.Layers() != 2 {
		t.Fatalf("Context %d, Layers %d", got.Context(), got.Layers())
	}
	other := c
	other.Width = 32
	if err := Compare(Config{Arch: coordinator.ArchTransformers, Transformers: other}, got); !errors.Is(err, ErrMismatch) ||
		!strings.Contains(err.Error(), "d_model is 32 in the model, 64 in the run") {
		t.Fatalf("Compare = %v", err)
	}
}

func TestConfigHash(t *testing.T) {
	// sha256("{}")[:16]
	if got := ConfigHash([]byte("{}")); got != "44136fa355b3678a1146ad16f7e8649e" {
		t.Fatalf("ConfigHash({}) = %s", got)
	}
}
