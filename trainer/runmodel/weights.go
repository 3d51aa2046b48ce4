package runmodel

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/weights"
)

// Seeded are the weights New(c, seed) draws, read a range at a time
// without ever being held whole (lm.Seeded): for an engine that holds the
// model elsewhere (a PyTorch worker), a model of gigabytes never exists in
// this process. An engine that computes here gets New's model
// (FromWeights).
func Seeded(c modelspec.Config, seed uint64) (weights.Weights, error) {
	w, err := Shape(c)
	if err != nil {
		return weights.Weights{}, err
	}
	var (
		inits  []lm.Init
		stream uint64
	)
	if c.Arch == coordinator.ArchGPT {
		inits, stream = gpt.Inits(c.GPT), gpt.Stream
	} else {
		inits, stream = llama.Inits(c.Llama), llama.Stream
	}
	sizes := make([]int, len(w.Shapes))
	for i, sh := range w.Shapes {
		sizes[i] = modelspec.Size(sh)
	}
	draws, err := lm.NewSeeded(sizes, inits, seed, stream)
	if err != nil {
		return weights.Weights{}, err
	}
	w.Seed, w.Seeded = seed, true
	w.Read = func(ctx context.Context, i, off int, dst []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return draws.Read(i, off, dst)
	}
	return w, nil
}

// Shape are weights of a GPT or Llama config with no values yet (Read is
// nil): their shapes, for a file to give them values (Weights.InFile,
// Weights.InPieces).
func Shape(c modelspec.Config) (weights.Weights, error) {
	var (
		shapes [][]int
		err    error
	)
	switch c.Arch {
	case coordinator.ArchGPT:
		err, shapes = c.GPT.Validate(), c.GPT.Shapes()
	case coordinator.ArchLlama:
		err, shapes = c.Llama.Validate(), c.Llama.Shapes()
	default:
		return weights.Weights{}, fmt.Errorf("%w: %d has its shapes from its engine", modelspec.ErrArchitecture, c.Arch)
	}
	if err != nil {
		return weights.Weights{}, err
	}
	return weights.Weights{Config: c, Shapes: shapes}, nil
}

// HostWeights are the weights of a model in this process, read from its
// tensors.
func HostWeights(m Model) (weights.Weights, error) {
	c, err := ConfigOf(m)
	if err != nil {
		return weights.Weights{}, err
	}
	tensors := m.Tensors()
	w := weights.Weights{Config: c, Shapes: m.Shapes(), Host: m, Read: func(_ context.Context, i, off int, dst []float32) error {
		copy(dst, tensors[i][off:off+len(dst)])
		return nil
	}}
	if t, ok := m.(*Transformers); ok {
		w.Names, w.JSON, w.Seed = t.names, t.JSON, t.Seed
		if !t.Drawn() {
			w.Read, w.Shapes = nil, nil
		}
	}
	return w, nil
}

// FromWeights is a model in this process holding w: w.Host itself, New's
// model for seeded weights, or a model of their config that every tensor
// is read into (a copy, for the engines that compute here and for tests).
func FromWeights(ctx context.Context, w weights.Weights, be kernels.Backend) (Model, error) {
	if m, ok := w.Host.(Model); ok {
		return m, nil
	}
	if w.Seeded {
		return New(w.Config, w.Seed, be)
	}
	if w.Config.Arch == coordinator.ArchTransformers {
		t, err := NewTransformers(w.JSON, w.Config.Transformers.Context, w.Seed)
		if err != nil || !w.Drawn() {
			return t, err
		}
		values := make([][]float32, len(w.Shapes))
		for i, sh := range w.Shapes {
			values[i] = make([]float32, modelspec.Size(sh))
			if err := w.Read(ctx, i, 0, values[i]); err != nil {
				return nil, err
			}
		}
		return t.WithTensors(slices.Clone(w.Names), w.Shapes, values)
	}
	if !w.Drawn() {
		return nil, weights.ErrNotDrawn
	}
	m, err := New(w.Config, 0, be)
	if err != nil {
		return nil, err
	}
	for i, t := range m.Tensors() {
		if i >= len(w.Shapes) || modelspec.Size(w.Shapes[i]) != len(t) {
			return nil, fmt.Errorf("runmodel: the weights' tensor %d does not fit the %s model's", i, w.Config.Arch)
		}
		if err := w.Read(ctx, i, 0, t); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SaveWeights writes w as Save writes a model: a Hugging Face directory
// when hf is set or the model is a Llama or a transformers model, otherwise
// one safetensors file with meta in its header.
func SaveWeights(ctx context.Context, w weights.Weights, path string, hf bool, meta map[string]string) error {
	tensors, err := w.Tensors(hf)
	if err != nil {
		return err
	}
	switch w.Config.Arch {
	case coordinator.ArchLlama:
		return llama.SaveHFTensors(ctx, path, w.Config.Llama, tensors, llama.HFOptions{})
	case coordinator.ArchGPT:
		if hf {
			return gpt.SaveHFTensors(ctx, path, w.Config.GPT, tensors)
		}
		return gpt.SaveTensors(ctx, path, w.Config.GPT, tensors, meta)
	}
	return saveTransformers(ctx, path, w.JSON, tensors)
}

// SaveWeightsFile writes GPT or Llama weights as one safetensors file with
// meta in its header, as a GPT's Save does (a Llama's Save writes a Hugging
// Face directory; this its single file).
func SaveWeightsFile(ctx context.Context, w weights.Weights, path string, meta map[string]string) error {
	tensors, err := w.Tensors(false)
	if err != nil {
		return err
	}
	switch w.Config.Arch {
	case coordinator.ArchLlama:
		return llama.SaveTensors(ctx, path, w.Config.Llama, tensors, meta)
	case coordinator.ArchGPT:
		return gpt.SaveTensors(ctx, path, w.Config.GPT, tensors, meta)
	}
	return fmt.Errorf("runmodel: a %s model has no single-file checkpoint", w.Config.Arch)
}

// saveTransformers writes a transformers model's Hugging Face directory:
// the run's config.json as it was read and model.safetensors in F32 (so its
// hash is the model's), which AutoModelForCausalLM.from_pretrained loads (a
// tied head is not stored: the config's tie_word_embeddings ties it again).
func saveTransformers(ctx context.Context, dir string, json []byte, tensors []checkpoint.Tensor) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("runmodel: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), json, 0o644); err != nil {
		return fmt.Errorf("runmodel: %w", err)
	}
	return checkpoint.Save(ctx, filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"})
}
