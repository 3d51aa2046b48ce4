package main

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/distro"
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
