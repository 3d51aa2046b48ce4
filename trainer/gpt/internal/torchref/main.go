// Command torchref writes what scripts/check-torch compares with a PyTorch
// GPT-2 written from transformers' definition: a small GPT with random
// weights as a Hugging Face GPT-2 directory (config.json, model.safetensors:
// what psyche export --to hf writes), a batch, and what the Go model computes
// from them (logits, loss, and every parameter's gradient in the same
// layout), so that the check covers the export's names and transposes as
// well as the model's maths. trainer/internal/torchref describes the files.
//
//	go run ./trainer/gpt/internal/torchref -dir DIR
package main

import (
	"context"
	"math/rand/v2"
	"path/filepath"

	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/internal/torchref"
)

func main() { torchref.Main(write) }

func write(ctx context.Context, dir string) error {
	cfg := gpt.Config{Vocab: 80, Context: 16, Width: 24, Layers: 2, Heads: 3}
	m, err := gpt.New(cfg, 1, nil)
	if err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(1, 98))
	torchref.Perturb(r, m.Params)
	if err := m.SaveHF(ctx, filepath.Join(dir, "model")); err != nil {
		return err
	}
	bt := torchref.NewBatch(r, 2, 12, cfg.Vocab)
	var out torchref.Out
	if err := out.Pass(m, bt, cfg.Vocab); err != nil {
		return err
	}
	return out.Write(ctx, dir, bt)
}
