package llama

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// checkpointConfig describes the model in a checkpoint's metadata.
func checkpointConfig(c Config) checkpoint.ModelConfig {
	return checkpoint.ModelConfig{Architecture: checkpoint.ArchLlama, VocabSize: uint32(c.Vocab),
		MaxSeqLen: uint32(c.Context), DModel: uint32(c.Width), NLayers: uint32(c.Layers), NHeads: uint32(c.Heads),
		NKVHeads: uint32(c.KVHeads), IntermediateSize: uint32(c.Intermediate), RopeTheta: c.RopeTheta, TiedHead: c.TiedHead}
}

// ConfigFromCheckpoint is the model shape a checkpoint's metadata describes
// (with the default RMSNorm ε, the one a run trains with).
func ConfigFromCheckpoint(mc checkpoint.ModelConfig) (Config, error) {
	if err := mc.Validate(); err != nil {
		return Config{}, err
	}
	if mc.Architecture != checkpoint.ArchLlama {
		return Config{}, fmt.Errorf("llama: the checkpoint holds a %q model", mc.Architecture)
	}
	c := Config{Vocab: int(mc.VocabSize), Context: int(mc.MaxSeqLen), Width: int(mc.DModel), Layers: int(mc.NLayers),
		Heads: int(mc.NHeads), KVHeads: int(mc.NKVHeads), Intermediate: int(mc.IntermediateSize), RopeTheta: mc.RopeTheta,
		TiedHead: mc.TiedHead}
	return c, c.Validate()
}

// Save writes the parameters, with Hugging Face's tensor names, and the
// model shape (plus meta) to one safetensors file atomically: the file
// peers exchange and transformers' safetensors loader reads as is. SaveHF
// writes a whole Hugging Face directory.
func (m *Model) Save(ctx context.Context, path string, meta map[string]string) error {
	return SaveTensors(ctx, path, m.Config, m.CheckpointTensors(), meta)
}

// SaveTensors is Save of a model of config c whose checkpoint tensors are
// tensors: their values may come from Fill, so a model held elsewhere (or
// drawn from a seed a range at a time) is written a chunk at a time.
func SaveTensors(ctx context.Context, path string, c Config, tensors []checkpoint.Tensor, meta map[string]string) error {
	// transformers' safetensors loader wants to be told the tensors are
	// PyTorch's.
	meta = maps.Clone(meta)
	if meta == nil {
		meta = map[string]string{}
	}
	meta["format"] = "pt"
	return lm.Save(ctx, path, tensors, checkpointConfig(c), meta)
}

// LoadParams copies a checkpoint's tensors into the model, checking that the
// checkpoint describes this model's shape and holds exactly its tensors.
func (m *Model) LoadParams(ck *checkpoint.Checkpoint) error {
	if err := lm.CheckShape("llama", ck, checkpointConfig(m.Config)); err != nil {
		return err
	}
	w, l := newHFCheck(m.Config, "")
	if err := l.take("checkpoint", ck.Infos(), ck, nil); err != nil {
		return err
	}
	if err := l.finish("checkpoint"); err != nil {
		return err
	}
	w.from = l.from
	for i, t := range m.Tensors() {
		if err := w.Read(context.Background(), i, 0, t); err != nil {
			return err
		}
	}
	return nil
}

// FromCheckpoint builds the model a decoded checkpoint describes.
func FromCheckpoint(ck *checkpoint.Checkpoint, be kernels.Backend) (*Model, error) {
	return lm.FromCheckpoint(ck, ConfigFromCheckpoint, func(c Config) (*Model, error) { return New(c, 0, be) })
}

// Load builds a model from a path: a Hugging Face directory (LoadHF) or a
// checkpoint file that Save wrote.
func Load(ctx context.Context, path string, be kernels.Backend) (*Model, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	if fi.IsDir() {
		return LoadHF(ctx, LocalDir(path), be)
	}
	ck, err := checkpoint.Load(path)
	if err != nil {
		return nil, err
	}
	m, err := FromCheckpoint(ck, be)
	if errors.Is(err, checkpoint.ErrNoModelConfig) {
		return nil, fmt.Errorf("llama: %s has no %s metadata; to load a Hugging Face checkpoint give its directory (with %s): %w", path, checkpoint.ModelKey, HFConfigFile, err)
	}
	if err != nil {
		return nil, fmt.Errorf("llama: %s: %w", path, err)
	}
	return m, nil
}
