package gpt

import (
	"context"
	"fmt"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// checkpointConfig describes the model in the checkpoint's metadata.
func checkpointConfig(c Config) checkpoint.ModelConfig {
	return checkpoint.ModelConfig{Architecture: checkpoint.ArchGPT, VocabSize: uint32(c.Vocab),
		MaxSeqLen: uint32(c.Context), DModel: uint32(c.Width), NLayers: uint32(c.Layers), NHeads: uint32(c.Heads)}
}

// ConfigFromCheckpoint is the model shape a checkpoint's metadata describes.
func ConfigFromCheckpoint(mc checkpoint.ModelConfig) (Config, error) {
	if err := mc.Validate(); err != nil {
		return Config{}, err
	}
	c := Config{Vocab: int(mc.VocabSize), Context: int(mc.MaxSeqLen), Width: int(mc.DModel), Layers: int(mc.NLayers), Heads: int(mc.NHeads)}
	return c, c.Validate()
}

// CheckpointTensors names the parameter tensors (views, not copies).
func (m *Model) CheckpointTensors() []checkpoint.Tensor { return lm.Cut(m.Pieces(), m.Tensors()) }

// Save writes the parameters and the model shape (plus meta) to a
// safetensors file atomically.
func (m *Model) Save(ctx context.Context, path string, meta map[string]string) error {
	return SaveTensors(ctx, path, m.Config, m.CheckpointTensors(), meta)
}

// SaveTensors is Save of a model of config c whose checkpoint tensors
// (Pieces) are tensors: their values may come from Fill, so a model held
// elsewhere is written a chunk at a time.
func SaveTensors(ctx context.Context, path string, c Config, tensors []checkpoint.Tensor, meta map[string]string) error {
	return lm.Save(ctx, path, tensors, checkpointConfig(c), meta)
}

// LoadParams copies a checkpoint's tensors into the model, checking that the
// checkpoint describes this model's shape and that every tensor is there with
// the right shape.
func (m *Model) LoadParams(ck *checkpoint.Checkpoint) error {
	if err := lm.CheckShape("gpt", ck, checkpointConfig(m.Config)); err != nil {
		return err
	}
	for i, s := range m.Specs() {
		data, err := ck.Tensor(s.Name, s.Shape)
		if err != nil {
			return fmt.Errorf("gpt: %w", err)
		}
		copy(m.Tensors()[i], data)
	}
	return nil
}

// Load builds a model from a checkpoint file.
func Load(path string, be kernels.Backend) (*Model, error) {
	ck, err := checkpoint.Load(path)
	if err != nil {
		return nil, err
	}
	return FromCheckpoint(ck, be)
}

// FromCheckpoint builds the model a decoded checkpoint describes.
func FromCheckpoint(ck *checkpoint.Checkpoint, be kernels.Backend) (*Model, error) {
	return lm.FromCheckpoint(ck, ConfigFromCheckpoint, func(c Config) (*Model, error) { return New(c, 0, be) })
}
