// Command torchref writes what scripts/check-torch compares with a PyTorch
// GPT-2 written from transformers' definition: a small GPT with random
// weights as a Hugging Face GPT-2 directory (config.json, model.safetensors:
// what psyche export --to hf writes), a batch, and what the Go model computes
// from them (logits, loss, and every parameter's gradient in the same
// layout), so that the check covers the export's names and transposes as
// well as the model's maths.
//
//	go run ./trainer/gpt/internal/torchref -dir DIR
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/gpt"
)

type run struct {
	B, T            int
	Inputs, Targets []uint32
}

func main() {
	dir := flag.String("dir", "", "output directory")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "torchref: -dir is required")
		os.Exit(2)
	}
	if err := write(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "torchref:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	ctx := context.Background()
	cfg := gpt.Config{Vocab: 80, Context: 16, Width: 24, Layers: 2, Heads: 3}
	m, err := gpt.New(cfg, 1, nil)
	if err != nil {
		return err
	}
	// Weights larger than the initialisation's, biases and norms away from
	// 0 and 1, so every term of every gradient carries signal.
	r := rand.New(rand.NewPCG(1, 98))
	for i := range m.Params {
		m.Params[i] += float32(r.NormFloat64() * 0.1)
	}
	if err := m.SaveHF(ctx, filepath.Join(dir, "model")); err != nil {
		return err
	}
	rn := run{B: 2, T: 12}
	for i := 0; i < rn.B*rn.T; i++ {
		rn.Inputs = append(rn.Inputs, uint32(r.IntN(cfg.Vocab)))
		rn.Targets = append(rn.Targets, uint32(r.IntN(cfg.Vocab)))
	}
	var out []checkpoint.Tensor
	add := func(name string, shape []int, data []float32) {
		out = append(out, checkpoint.Tensor{Name: name, Shape: shape, Data: append([]float32(nil), data...)})
	}
	if _, err := m.Forward(rn.Inputs, nil, rn.B, rn.T); err != nil {
		return err
	}
	add("logits", []int{rn.B, rn.T, cfg.Vocab}, m.Logits())
	loss, err := m.Forward(rn.Inputs, rn.Targets, rn.B, rn.T)
	if err != nil {
		return err
	}
	add("loss", []int{1}, []float32{loss})
	m.ZeroGrad()
	if err := m.Backward(); err != nil {
		return err
	}
	for _, g := range m.HFGradTensors() {
		add("grad."+g.Name, g.Shape, g.Data)
	}
	if err := checkpoint.Save(ctx, filepath.Join(dir, "go.safetensors"), out, nil); err != nil {
		return err
	}
	b, err := json.Marshal(rn)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644)
}
