package lm

import (
	"context"
	"fmt"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// Save writes tensors and the model shape mc (plus meta) to a safetensors
// file atomically.
func Save(ctx context.Context, path string, tensors []checkpoint.Tensor, mc checkpoint.ModelConfig, meta map[string]string) error {
	meta, err := checkpoint.WithModelConfig(meta, mc)
	if err != nil {
		return err
	}
	return checkpoint.Save(ctx, path, tensors, meta)
}

// CheckShape returns the model shape ck's metadata describes, or an error
// (starting with pkg) when it is not want, the loading model's.
func CheckShape(pkg string, ck *checkpoint.Checkpoint, want checkpoint.ModelConfig) error {
	mc, err := ck.ModelConfig()
	if err != nil {
		return err
	}
	if mc != want {
		return fmt.Errorf("%s: checkpoint is for %+v, this model is %+v", pkg, mc, want)
	}
	return nil
}

// FromCheckpoint builds the model a decoded checkpoint describes: config
// turns its metadata into the model's config, build makes a model of it,
// whose LoadParams then copies the checkpoint's tensors in.
func FromCheckpoint[C any, M interface {
	LoadParams(*checkpoint.Checkpoint) error
}](ck *checkpoint.Checkpoint, config func(checkpoint.ModelConfig) (C, error), build func(C) (M, error)) (M, error) {
	var none M
	mc, err := ck.ModelConfig()
	if err != nil {
		return none, err
	}
	c, err := config(mc)
	if err != nil {
		return none, err
	}
	m, err := build(c)
	if err != nil {
		return none, err
	}
	return m, m.LoadParams(ck)
}

// Cut is the checkpoint tensors pieces name, cut from the parameters (or
// the gradients) in Specs order: views, or transposed copies.
func Cut(pieces []modelspec.Piece, tensors [][]float32) []checkpoint.Tensor {
	out := make([]checkpoint.Tensor, len(pieces))
	for i, p := range pieces {
		out[i] = checkpoint.Tensor{Name: p.Name, Shape: p.Shape, Data: p.Values(tensors)}
	}
	return out
}
