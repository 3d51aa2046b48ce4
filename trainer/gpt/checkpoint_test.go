package gpt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/trainer/checkpoint"
)

func TestCheckpointRoundTrip(t *testing.T) {
	m, _ := New(tiny, 5, nil)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := m.Save(context.Background(), path, map[string]string{"step": "12"}); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Config != m.Config || !slices.Equal(got.Params, m.Params) {
		t.Fatal("loaded model differs")
	}
	// A checkpoint of another shape is refused.
	other, _ := New(Config{Vocab: 11, Context: 6, Width: 8, Layers: 1, Heads: 2}, 5, nil)
	ck, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.LoadParams(ck); err == nil {
		t.Fatal("loaded a checkpoint of another shape")
	}
	// A checkpoint without model metadata is refused.
	bare := filepath.Join(t.TempDir(), "bare.safetensors")
	if err := checkpoint.Save(context.Background(), bare, m.CheckpointTensors(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bare, nil); !errors.Is(err, checkpoint.ErrNoModelConfig) {
		t.Fatalf("got %v", err)
	}
}

// TestHFRoundTrip writes a model as a Hugging Face GPT-2 directory and
// reads it back: the same weights, GPT-2's names and Conv1D shapes, and
// configs this model does not compute refused by name.
func TestHFRoundTrip(t *testing.T) {
	cfg := Config{Vocab: 50, Context: 8, Width: 12, Layers: 2, Heads: 3}
	m, err := New(cfg, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.Params { // biases and norms off their initial values too
		m.Params[i] += float32(i%7) * 0.01
	}
	dir := t.TempDir()
	if err := m.SaveHF(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	if !IsHFDir(dir) {
		t.Fatal("IsHFDir: false for a GPT-2 directory")
	}
	back, err := LoadHF(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if back.Config != cfg || !slices.Equal(back.Params, m.Params) {
		t.Fatal("the directory read back holds another model")
	}
	ck, err := checkpoint.Load(filepath.Join(dir, HFModelFile))
	if err != nil {
		t.Fatal(err)
	}
	// c_attn.weight is in×out: row i of it is column i of our qkv weight.
	w, err := ck.Tensor("transformer.h.1.attn.c_attn.weight", []int{12, 36})
	if err != nil {
		t.Fatal(err)
	}
	ours := m.p.qkvw[36*12:] // layer 1, 36×12
	if w[2*36+5] != ours[5*12+2] {
		t.Fatal("c_attn.weight is not the transpose of the qkv weight")
	}
	raw, _ := os.ReadFile(filepath.Join(dir, HFConfigFile))
	for _, tc := range []struct{ from, to, want string }{
		{`"gelu_new"`, `"relu"`, "activation_function"},
		{`"model_type": "gpt2"`, `"model_type": "llama"`, "model_type"},
		{`"layer_norm_epsilon": 0.00001`, `"layer_norm_epsilon": 0.000001`, "layer_norm_epsilon"},
		{`"tie_word_embeddings": true`, `"tie_word_embeddings": false`, "tie_word_embeddings"},
	} {
		bad := strings.Replace(string(raw), tc.from, tc.to, 1)
		if bad == string(raw) {
			t.Fatalf("config.json has no %s", tc.from)
		}
		if _, err := ParseHFConfig("config.json", []byte(bad)); !errors.Is(err, ErrHFConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.to, err)
		}
	}
}

// FuzzLoadHF feeds LoadHF (the production reader, with its limits) a
// config.json and a model.safetensors from outside: it must never panic,
// must refuse with one of its errors or the safetensors reader's, and a
// model it accepts must be one whose export reads back the same.
func FuzzLoadHF(f *testing.F) {
	m, _ := New(Config{Vocab: 20, Context: 4, Width: 8, Layers: 1, Heads: 2}, 1, nil)
	dir := f.TempDir()
	if err := m.SaveHF(context.Background(), dir); err != nil {
		f.Fatal(err)
	}
	cfg, _ := os.ReadFile(filepath.Join(dir, HFConfigFile))
	st, _ := os.ReadFile(filepath.Join(dir, HFModelFile))
	f.Add(cfg, st)
	f.Add(cfg, st[:len(st)/2])
	f.Add([]byte(`{"model_type":"gpt2","vocab_size":1000000,"n_positions":1000000,"n_embd":65536,"n_layer":1000,"n_head":64}`), st)
	errTooBig := errors.New("more parameters than the fuzzer's run allows")
	f.Fuzz(func(t *testing.T, cfg, st []byte) {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, HFConfigFile), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, HFModelFile), st, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := LoadHF(d, nil, func(c Config) error {
			if c.NumParams() > 1<<20 {
				return errTooBig
			}
			return nil
		})
		if err != nil {
			for _, e := range []error{ErrHFConfig, ErrHFValues, errTooBig, checkpoint.ErrMalformed, checkpoint.ErrTruncated,
				checkpoint.ErrTooLarge, checkpoint.ErrUnsupportedDType, checkpoint.ErrInvalidTensor, checkpoint.ErrInvalidMetadata,
				checkpoint.ErrNotFound, checkpoint.ErrShapeMismatch} {
				if errors.Is(err, e) {
					return
				}
			}
			t.Fatalf("unexpected error kind: %v", err)
		}
		out := t.TempDir()
		if err := got.SaveHF(context.Background(), out); err != nil {
			t.Fatal(err)
		}
		back, err := LoadHF(out, nil, nil)
		if err != nil || !slices.Equal(back.Params, got.Params) {
			t.Fatalf("an accepted model does not read back the same: %v", err)
		}
	})
}
