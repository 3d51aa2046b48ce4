package checkpoint

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestModelConfigRoundTrip(t *testing.T) {
	cfg := ModelConfig{Architecture: ArchGPT, VocabSize: 256, MaxSeqLen: 128, DModel: 64, NLayers: 2, NHeads: 4}
	in := map[string]string{"step": "9"}
	meta, err := WithModelConfig(in, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := in[ModelKey]; ok {
		t.Fatal("WithModelConfig modified its input")
	}
	const js = `{"architecture":"gpt","vocab_size":256,"max_seq_len":128,"d_model":64,"n_layers":2,"n_heads":4}`
	if meta[ModelKey] != js || meta["step"] != "9" {
		t.Fatalf("metadata = %v", meta)
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := Save(t.Context(), path, []Tensor{{Name: "w", Data: []float32{1}}}, meta); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ModelConfig()
	if err != nil || got != cfg {
		t.Fatalf("ModelConfig = %+v, %v", got, err)
	}
	if meta, err := WithModelConfig(nil, cfg); err != nil || len(meta) != 1 {
		t.Fatalf("WithModelConfig(nil) = %v, %v", meta, err)
	}
}

func TestLlamaModelConfigRoundTrip(t *testing.T) {
	for _, cfg := range []ModelConfig{
		{Architecture: ArchLlama, VocabSize: 128256, MaxSeqLen: 8192, DModel: 2048, NLayers: 16, NHeads: 32,
			NKVHeads: 8, IntermediateSize: 8192, RopeTheta: 500000, TiedHead: true},
		{Architecture: ArchLlama, VocabSize: 32000, MaxSeqLen: 4096, DModel: 4096, NLayers: 32, NHeads: 32,
			NKVHeads: 32, IntermediateSize: 11008, RopeTheta: 10000},
	} {
		meta, err := WithModelConfig(nil, cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseModelConfig(meta[ModelKey])
		if err != nil || got != cfg {
			t.Fatalf("%s: ParseModelConfig = %+v, %v", meta[ModelKey], got, err)
		}
	}
	// A GPT config's JSON has no Llama field: old checkpoints' bytes stay.
	meta, _ := WithModelConfig(nil, ModelConfig{Architecture: ArchGPT, VocabSize: 256, MaxSeqLen: 128, DModel: 64, NLayers: 2, NHeads: 4})
	if want := `{"architecture":"gpt","vocab_size":256,"max_seq_len":128,"d_model":64,"n_layers":2,"n_heads":4}`; meta[ModelKey] != want {
		t.Fatalf("GPT config JSON %s, want %s", meta[ModelKey], want)
	}
}

func TestModelConfigMissing(t *testing.T) {
	enc, _ := Encode(nil, map[string]string{"other": "x"})
	c, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ModelConfig(); !errors.Is(err, ErrNoModelConfig) {
		t.Fatalf("ModelConfig without the key = %v", err)
	}
}

func TestModelConfigRejects(t *testing.T) {
	good := ModelConfig{Architecture: ArchGPT, VocabSize: 256, MaxSeqLen: 128, DModel: 64, NLayers: 2, NHeads: 4}
	bad := []struct {
		name string
		m    func(*ModelConfig)
		want string
	}{
		{"arch", func(c *ModelConfig) { c.Architecture = "" }, `architecture ""`},
		{"vocab", func(c *ModelConfig) { c.VocabSize = 0 }, "vocab_size"},
		{"seq", func(c *ModelConfig) { c.MaxSeqLen = 0 }, "max_seq_len"},
		{"width", func(c *ModelConfig) { c.DModel = 0 }, "d_model must"},
		{"layers", func(c *ModelConfig) { c.NLayers = 0 }, "n_layers"},
		{"heads", func(c *ModelConfig) { c.NHeads = 5 }, "n_heads (5)"},
		{"no heads", func(c *ModelConfig) { c.NHeads = 0 }, "n_heads (0)"},
	}
	for _, tc := range bad {
		c := good
		tc.m(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidModelConfig) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "checkpoint: ") {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := WithModelConfig(nil, ModelConfig{Architecture: "rnn"}); !errors.Is(err, ErrInvalidModelConfig) {
		t.Errorf("WithModelConfig accepted an invalid config: %v", err)
	}

	for _, tc := range []struct{ name, js, want string }{
		{"not JSON", `gpt`, "not a JSON object"},
		{"null", `null`, "not a JSON object"},
		{"array", `[]`, "not a JSON object"},
		{"truncated", `{"architecture":"gpt"`, "EOF"},
		{"trailing", `{"architecture":"gpt","vocab_size":1,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1} {}`, "after the JSON object"},
		{"missing", `{"architecture":"gpt","vocab_size":1,"max_seq_len":1,"d_model":1,"n_layers":1}`, `missing field "n_heads"`},
		{"unknown", `{"architecture":"gpt","vocab_size":1,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1,"n_kv_heads":1}`, "are Llama fields"},
		{"unknown", `{"architecture":"gpt","vocab_size":1,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1,"head_dim":1}`, `unknown field "head_dim"`},
		{"llama missing", `{"architecture":"llama","vocab_size":1,"max_seq_len":1,"d_model":2,"n_layers":1,"n_heads":1,"n_kv_heads":1,"intermediate_size":3}`, `missing field "rope_theta"`},
		{"llama theta", `{"architecture":"llama","vocab_size":1,"max_seq_len":1,"d_model":2,"n_layers":1,"n_heads":1,"n_kv_heads":1,"intermediate_size":3,"rope_theta":"big"}`, "not a number"},
		{"llama theta huge", `{"architecture":"llama","vocab_size":1,"max_seq_len":1,"d_model":2,"n_layers":1,"n_heads":1,"n_kv_heads":1,"intermediate_size":3,"rope_theta":1e39}`, "float32"},
		{"llama tied", `{"architecture":"llama","vocab_size":1,"max_seq_len":1,"d_model":2,"n_layers":1,"n_heads":1,"n_kv_heads":1,"intermediate_size":3,"rope_theta":10000,"tied_head":1}`, "not a boolean"},
		{"llama kv", `{"architecture":"llama","vocab_size":1,"max_seq_len":1,"d_model":8,"n_layers":1,"n_heads":4,"n_kv_heads":3,"intermediate_size":3,"rope_theta":10000}`, "n_kv_heads (3)"},
		{"case", `{"Architecture":"gpt","vocab_size":1,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, `unknown field "Architecture"`},
		{"duplicate", `{"architecture":"gpt","vocab_size":1,"vocab_size":2,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, "duplicate key"},
		{"null field", `{"architecture":"gpt","vocab_size":null,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, "not a number"},
		{"string field", `{"architecture":"gpt","vocab_size":"1","max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, "not a number"},
		{"negative", `{"architecture":"gpt","vocab_size":-1,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, "not an integer"},
		{"fraction", `{"architecture":"gpt","vocab_size":1.5,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, "not an integer"},
		{"too big", `{"architecture":"gpt","vocab_size":4294967296,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, "not an integer"},
		{"arch number", `{"architecture":1,"vocab_size":1,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, "not a string"},
		{"arch unknown", `{"architecture":"rnn","vocab_size":1,"max_seq_len":1,"d_model":1,"n_layers":1,"n_heads":1}`, `architecture "rnn"`},
		{"invalid", `{"architecture":"gpt","vocab_size":1,"max_seq_len":1,"d_model":6,"n_layers":1,"n_heads":4}`, "n_heads (4)"},
	} {
		_, err := ParseModelConfig(tc.js)
		if !errors.Is(err, ErrInvalidModelConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ParseModelConfig = %v, want %q", tc.name, err, tc.want)
		}
	}
	// Through a checkpoint, the same errors surface from ModelConfig.
	enc, _ := Encode(nil, map[string]string{ModelKey: `{"architecture":"gpt"}`})
	c, _ := Decode(enc)
	if _, err := c.ModelConfig(); !errors.Is(err, ErrInvalidModelConfig) {
		t.Errorf("ModelConfig of a bad entry = %v", err)
	}
}
