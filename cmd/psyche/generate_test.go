package main

import (
	"context"
	"encoding/json"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// TestGenerate trains a tiny byte GPT on a repeating text until it knows
// it, saves it, and asks psyche generate to continue the text: greedy
// sampling must go on with the pattern, sampling with a seed must repeat,
// and a model with another vocabulary must ask for its tokenizer.
func TestGenerate(t *testing.T) {
	cfg := gpt.Config{Vocab: 256, Context: 16, Width: 32, Layers: 1, Heads: 2}
	m, err := gpt.New(cfg, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("psyche ", 40)
	var sizes []int
	for _, x := range m.Tensors() {
		sizes = append(sizes, len(x))
	}
	opt := distro.NewAdamW(sizes, 0.9, 0.99, 1e-8, 0)
	r := rand.New(rand.NewPCG(1, 1))
	const b, n = 8, 16
	in, tg := make([]uint32, b*n), make([]uint32, b*n)
	for step := 0; step < 300; step++ {
		for i := 0; i < b; i++ {
			at := r.IntN(len(text) - n - 1)
			for j := 0; j < n; j++ {
				in[i*n+j], tg[i*n+j] = uint32(text[at+j]), uint32(text[at+j+1])
			}
		}
		if _, err := m.Forward(in, tg, b, n); err != nil {
			t.Fatal(err)
		}
		m.ZeroGrad()
		if err := m.Backward(); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(m.Tensors(), m.GradTensors(), 1e-2); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "tiny.safetensors")
	if err := m.Save(context.Background(), path, nil); err != nil {
		t.Fatal(err)
	}
	out, errs, code := psyche(t, "generate", "--model", path, "--prompt", "psyche psy", "--tokens", "24", "--temperature", "0")
	if code != 0 {
		t.Fatalf("generate: %d %s", code, errs)
	}
	if want := "che psyche psyche psyche"; !strings.HasPrefix(out, want) {
		t.Fatalf("greedy continuation %q, want it to begin %q", out, want)
	}
	// The same model as a Hugging Face GPT-2 directory (what psyche export
	// writes) continues the text alike, as --help says it does.
	hf := filepath.Join(t.TempDir(), "tiny-hf")
	if err := m.SaveHF(context.Background(), hf); err != nil {
		t.Fatal(err)
	}
	if fromDir, errs, code := psyche(t, "generate", "--model", hf, "--prompt", "psyche psy", "--tokens", "24", "--temperature", "0"); code != 0 || fromDir != out {
		t.Fatalf("generate from a GPT-2 directory: %d %q %s, want %q", code, fromDir, errs, out)
	}
	if help, _, _ := psyche(t, "generate", "--help"); !strings.Contains(help, "Hugging Face directory (GPT-2 or Llama") {
		t.Errorf("generate --help does not say that a GPT-2 directory works:\n%s", help)
	}
	sampled := func(seed string) string {
		out, errs, code := psyche(t, "generate", "--model", path, "--prompt", "psy", "--tokens", "30", "--temperature", "1.5", "--top-k", "0", "--seed", seed)
		if code != 0 {
			t.Fatalf("generate: %d %s", code, errs)
		}
		return out
	}
	if a, b := sampled("7"), sampled("7"); a != b {
		t.Fatalf("one seed, two texts: %q, %q", a, b)
	}
	big, _ := gpt.New(gpt.Config{Vocab: 300, Context: 8, Width: 8, Layers: 1, Heads: 2}, 1, nil)
	bigPath := filepath.Join(t.TempDir(), "big.safetensors")
	if err := big.Save(context.Background(), bigPath, nil); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := psyche(t, "generate", "--model", bigPath, "--prompt", "x"); code == 0 || !strings.Contains(errs, "--tokenizer") {
		t.Fatalf("a 300-token model without a tokenizer: %d %s", code, errs)
	}
}

// TestExportHF writes a GPT and a Llama checkpoint as Hugging Face
// directories and reads them back: the same models.
func TestExportHF(t *testing.T) {
	g, _ := gpt.New(gpt.Config{Vocab: 64, Context: 8, Width: 16, Layers: 2, Heads: 2}, 3, nil)
	l, _ := llama.New(llama.Config{Vocab: 64, Context: 8, Width: 16, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 24, RopeTheta: 10000, TiedHead: true}, 3, nil)
	dir := t.TempDir()
	for name, m := range map[string]runmodel.Model{"gpt": g, "llama": l} {
		file := filepath.Join(dir, name+".safetensors")
		if err := m.Save(context.Background(), file, nil); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, name+"-hf")
		stdout, errs, code := psyche(t, "export", "--to", "hf", "--model", file, "--out", out)
		if code != 0 || !strings.Contains(stdout, runmodel.Revision(m)) {
			t.Fatalf("%s: export: %d %s %s", name, code, stdout, errs)
		}
		back, err := runmodel.Load(context.Background(), out, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if back.Hash() != m.Hash() {
			t.Fatalf("%s: the exported directory holds another model", name)
		}
	}
	if _, errs, code := psyche(t, "export", "--to", "onnx", "--model", "x", "--out", "y"); code == 0 || !strings.Contains(errs, "hf") {
		t.Fatalf("--to onnx: %d %s", code, errs)
	}
}

// TestGenerateAndExportRefuseAnOversizedConfig: a downloaded checkpoint
// whose config describes a model larger than its safetensors files hold (a
// config.json claiming a trillion parameters beside a small
// model.safetensors) is refused by psyche generate and export before
// anything is allocated for it: it ended both in a fatal out-of-memory.
// Checked first on configs small enough that the old loader survived them
// (it allocated the model, then found the tensors wrong), measuring what
// the refusal allocates; then on the trillion.
func TestGenerateAndExportRefuseAnOversizedConfig(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	lm, _ := llama.New(llama.Config{Vocab: 64, Context: 8, Width: 16, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 24, RopeTheta: 10000, TiedHead: true}, 3, nil)
	llamaDir := filepath.Join(dir, "llama")
	if err := lm.SaveHF(ctx, llamaDir, llama.HFOptions{}); err != nil {
		t.Fatal(err)
	}
	g, _ := gpt.New(gpt.Config{Vocab: 64, Context: 8, Width: 16, Layers: 2, Heads: 2}, 3, nil)
	gptDir := filepath.Join(dir, "gpt")
	if err := g.SaveHF(ctx, gptDir); err != nil {
		t.Fatal(err)
	}
	// setConfig rewrites keys of a directory's config.json.
	setConfig := func(dir string, set map[string]any) {
		t.Helper()
		path := filepath.Join(dir, "config.json")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		maps.Copy(cfg, set)
		delete(cfg, "head_dim")
		if b, err = json.Marshal(cfg); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A psyche checkpoint file whose metadata claims a larger GPT than
	// its tensors.
	fileWith := func(name string, mc checkpoint.ModelConfig) string {
		t.Helper()
		meta, err := checkpoint.WithModelConfig(nil, mc)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := checkpoint.Save(ctx, path, g.CheckpointTensors(), meta); err != nil {
			t.Fatal(err)
		}
		return path
	}
	refused := func(what, path string, allocLimit uint64) {
		t.Helper()
		for _, args := range [][]string{
			{"generate", "--model", path, "--prompt", "x", "--tokens", "1"},
			{"export", "--model", path, "--out", filepath.Join(dir, "out")},
		} {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, errs, code := psyche(t, args...)
			runtime.ReadMemStats(&after)
			if code == 0 || !strings.Contains(errs, "larger than its tensors") {
				t.Fatalf("%s: %s: exit %d, %s; want a refusal (the config describes a model larger than its tensors)", what, args[0], code, errs)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > allocLimit {
				t.Fatalf("%s: %s allocated %d MiB before refusing", what, args[0], grew>>20)
			}
		}
	}
	// ~34M parameters each: 260 MiB of weights and gradients, which the
	// old loader allocated.
	setConfig(llamaDir, map[string]any{"vocab_size": 16384, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 6,
		"num_attention_heads": 8, "num_key_value_heads": 8})
	setConfig(gptDir, map[string]any{"vocab_size": 16384, "n_embd": 512, "n_layer": 8, "n_head": 8, "n_positions": 1024})
	file := fileWith("gpt.safetensors", checkpoint.ModelConfig{Architecture: checkpoint.ArchGPT, VocabSize: 16384, MaxSeqLen: 1024, DModel: 512, NLayers: 8, NHeads: 8})
	for what, path := range map[string]string{"a Llama directory": llamaDir, "a GPT-2 directory": gptDir, "a checkpoint file": file} {
		refused(what, path, 16<<20)
	}
	// A trillion parameters.
	setConfig(llamaDir, map[string]any{"vocab_size": 128256, "hidden_size": 16384, "intermediate_size": 65536, "num_hidden_layers": 300,
		"num_attention_heads": 128, "num_key_value_heads": 8})
	setConfig(gptDir, map[string]any{"vocab_size": 50257, "n_embd": 16384, "n_layer": 300, "n_head": 128, "n_positions": 2048})
	file = fileWith("trillion.safetensors", checkpoint.ModelConfig{Architecture: checkpoint.ArchGPT, VocabSize: 50257, MaxSeqLen: 2048, DModel: 16384, NLayers: 300, NHeads: 128})
	for what, path := range map[string]string{"a trillion-parameter Llama directory": llamaDir, "a trillion-parameter GPT-2 directory": gptDir, "a trillion-parameter checkpoint file": file} {
		refused(what, path, 16<<20)
	}
	// What the files do hold still loads.
	if _, err := runmodel.LoadUntrusted(ctx, fileWith("honest.safetensors", checkpoint.ModelConfig{Architecture: checkpoint.ArchGPT,
		VocabSize: 64, MaxSeqLen: 8, DModel: 16, NLayers: 2, NHeads: 2}), nil); err != nil {
		t.Fatalf("a checkpoint whose config its tensors hold: %v", err)
	}
}
