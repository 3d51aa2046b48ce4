package runmodel

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/weights"
)

// Model is what a trainer trains, whatever the architecture: *gpt.Model or
// *llama.Model. The optimizers and the P2P checkpoint exchange see it as a
// list of float32 tensors.
type Model interface {
	Forward(inputs, targets []uint32, b, t int) (float32, error)
	SequenceLosses(t int) []float32
	Backward() error
	ZeroGrad()
	Logits() []float32
	Tensors() [][]float32
	GradTensors() [][]float32
	Shapes() [][]int
	CheckpointTensors() []checkpoint.Tensor
	Save(ctx context.Context, path string, meta map[string]string) error
	Hash() [sha256.Size]byte
	NumParams() int
	FLOPsPerToken(t int) float64
}

var (
	_ Model = (*gpt.Model)(nil)
	_ Model = (*llama.Model)(nil)
)

// ConfigOf is the config of a model; a model of a type this package does
// not build wraps ErrArchitecture.
func ConfigOf(m Model) (modelspec.Config, error) {
	switch m := m.(type) {
	case *gpt.Model:
		return modelspec.Config{Arch: coordinator.ArchGPT, GPT: m.Config}, nil
	case *llama.Model:
		return modelspec.Config{Arch: coordinator.ArchLlama, Llama: m.Config}, nil
	case *Transformers:
		return modelspec.Config{Arch: coordinator.ArchTransformers, Transformers: m.Config}, nil
	}
	return modelspec.Config{}, fmt.Errorf("%w: a model of type %T", modelspec.ErrArchitecture, m)
}

// Save writes m to path as a checkpoint: a Hugging Face directory
// (config.json and model.safetensors in F32, so its hash is the model's)
// when hf is set or the model is a Llama (a Llama checkpoint is always one:
// what transformers loads, and what a run's checkpoint URL may name),
// otherwise one safetensors file with meta in its header.
func Save(ctx context.Context, m Model, path string, hf bool, meta map[string]string) error {
	switch m := m.(type) {
	case *llama.Model:
		return m.SaveHF(ctx, path, llama.HFOptions{})
	case *gpt.Model:
		if hf {
			return m.SaveHF(ctx, path)
		}
		return m.Save(ctx, path, meta)
	case *Transformers:
		return m.Save(ctx, path, meta)
	}
	return fmt.Errorf("%w: a model of type %T", modelspec.ErrArchitecture, m)
}

// SavesHF says whether Save writes m as a Hugging Face directory rather
// than one file.
func SavesHF(c modelspec.Config, hf bool) bool {
	return hf || c.Arch == coordinator.ArchLlama || c.Arch == coordinator.ArchTransformers
}

// New builds a model of config c with initial weights drawn from seed.
func New(c modelspec.Config, seed uint64, be kernels.Backend) (Model, error) {
	switch c.Arch {
	case coordinator.ArchGPT:
		return gpt.New(c.GPT, seed, be)
	case coordinator.ArchLlama:
		return llama.New(c.Llama, seed, be)
	case coordinator.ArchTransformers:
		return nil, fmt.Errorf("%w: a transformers model is built from its config.json (LoadTransformersConfig)", modelspec.ErrArchitecture)
	}
	return nil, fmt.Errorf("%w: %d", modelspec.ErrArchitecture, c.Arch)
}

// Accept vets the config a checkpoint describes before anything is
// allocated for its model: a checkpoint from elsewhere (a URL an elected
// checkpointer recorded) may describe any size, and a trainer allocates only
// for the run's model (Compare). Nil accepts every config.
type Accept func(modelspec.Config) error

func (a Accept) check(c modelspec.Config) error {
	if a == nil {
		return nil
	}
	return a(c)
}

// FromCheckpoint builds the model a decoded checkpoint file describes (its
// psyche.model metadata names the architecture).
func FromCheckpoint(ck *checkpoint.Checkpoint, be kernels.Backend) (Model, error) {
	return FromCheckpointChecked(ck, be, nil)
}

// FromCheckpointChecked is FromCheckpoint that asks accept about the
// checkpoint's config before building its model.
func FromCheckpointChecked(ck *checkpoint.Checkpoint, be kernels.Backend, accept Accept) (Model, error) {
	mc, err := ck.ModelConfig()
	if err != nil {
		return nil, err
	}
	if mc.Architecture == checkpoint.ArchLlama {
		c, err := llama.ConfigFromCheckpoint(mc)
		if err != nil {
			return nil, err
		}
		if err := accept.check(modelspec.Config{Arch: coordinator.ArchLlama, Llama: c}); err != nil {
			return nil, err
		}
		return llama.FromCheckpoint(ck, be)
	}
	c, err := gpt.ConfigFromCheckpoint(mc)
	if err != nil {
		return nil, err
	}
	if err := accept.check(modelspec.Config{Arch: coordinator.ArchGPT, GPT: c}); err != nil {
		return nil, err
	}
	return gpt.FromCheckpoint(ck, be)
}

// Load builds the model at path: a checkpoint file of either architecture
// or a Hugging Face directory (GPT-2 or Llama).
func Load(ctx context.Context, path string, be kernels.Backend) (Model, error) {
	return LoadChecked(ctx, path, be, nil)
}

// LoadChecked is Load that asks accept about the checkpoint's config before
// building its model.
func LoadChecked(ctx context.Context, path string, be kernels.Backend, accept Accept) (Model, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		if gpt.IsHFDir(path) {
			return gpt.LoadHF(path, be, func(c gpt.Config) error {
				return accept.check(modelspec.Config{Arch: coordinator.ArchGPT, GPT: c})
			})
		}
		return LoadHFChecked(ctx, llama.LocalDir(path), be, accept)
	}
	ck, err := checkpoint.Load(path)
	if err != nil {
		return nil, err
	}
	m, err := FromCheckpointChecked(ck, be, accept)
	if errors.Is(err, checkpoint.ErrNoModelConfig) {
		return nil, fmt.Errorf("runmodel: %s: %w (a Hugging Face checkpoint is loaded from its directory, with config.json)", path, err)
	}
	return m, err
}

// OpenChecked are the weights of the checkpoint at path, as LoadChecked
// reads it, but read from its files as they are needed rather than built
// into a model here, so an engine that holds the model elsewhere opens on a
// checkpoint of gigabytes without this process holding it: a checkpoint
// file Save wrote (openFile) or a Llama Hugging Face directory
// (llama.OpenHF). A GPT-2 Hugging Face directory, whose matrices are
// stored transposed, is loaded (LoadChecked). The caller closes the
// weights.
func OpenChecked(ctx context.Context, path string, be kernels.Backend, accept Accept) (weights.Weights, error) {
	fi, err := os.Stat(path)
	if err == nil && !fi.IsDir() {
		f, err := checkpoint.Limits{}.Open(path)
		if err != nil {
			return weights.Weights{}, err
		}
		return OpenFile(f, accept)
	}
	if err == nil && !gpt.IsHFDir(path) {
		return OpenHF(ctx, llama.LocalDir(path), accept)
	}
	m, err := LoadChecked(ctx, path, be, accept)
	if err != nil {
		return weights.Weights{}, err
	}
	return HostWeights(m)
}

// OpenHF are the weights of a Hugging Face Llama directory, local or
// remote, read from its files as they are asked for (llama.OpenHF). The
// caller closes them.
func OpenHF(ctx context.Context, d llama.Dir, accept Accept) (weights.Weights, error) {
	hf, err := llama.OpenHF(ctx, d, func(c llama.Config) error {
		return accept.check(modelspec.Config{Arch: coordinator.ArchLlama, Llama: c})
	})
	if err != nil {
		return weights.Weights{}, err
	}
	return weights.Weights{Config: modelspec.Config{Arch: coordinator.ArchLlama, Llama: hf.Config}, Shapes: hf.Config.Shapes(),
		Read: hf.Read, Release: hf.Close}, nil
}

// OpenFile are the weights of a checkpoint file Save wrote, read from f as
// they are asked for: its psyche.model metadata names the config (which
// accept must take before anything else is read), and the file must hold
// every piece of that model with its shape, and nothing else. The weights
// own f: closing them closes it (and so does a refusal).
func OpenFile(f *checkpoint.File, accept Accept) (weights.Weights, error) {
	path := f.Name()
	opened := false
	defer func() {
		if !opened {
			f.Close()
		}
	}()
	meta, ok := f.Metadata()[checkpoint.ModelKey]
	if !ok {
		return weights.Weights{}, fmt.Errorf("runmodel: %s: %w (a Hugging Face checkpoint is loaded from its directory, with config.json)", path, checkpoint.ErrNoModelConfig)
	}
	mc, err := checkpoint.ParseModelConfig(meta)
	if err != nil {
		return weights.Weights{}, fmt.Errorf("runmodel: %s: %w", path, err)
	}
	var c modelspec.Config
	if mc.Architecture == checkpoint.ArchLlama {
		c.Arch = coordinator.ArchLlama
		c.Llama, err = llama.ConfigFromCheckpoint(mc)
	} else {
		c.Arch = coordinator.ArchGPT
		c.GPT, err = gpt.ConfigFromCheckpoint(mc)
	}
	if err == nil {
		err = accept.check(c)
	}
	if err != nil {
		return weights.Weights{}, fmt.Errorf("runmodel: %s: %w", path, err)
	}
	shape, err := Shape(c)
	if err != nil {
		return weights.Weights{}, err
	}
	pieces, err := shape.Pieces(false)
	if err != nil {
		return weights.Weights{}, err
	}
	held := map[string][]int{}
	for _, t := range f.Tensors() {
		held[t.Name] = t.Shape
	}
	for _, p := range pieces {
		got, ok := held[p.Name]
		switch {
		case !ok:
			return weights.Weights{}, fmt.Errorf("runmodel: %s: %w: %q", path, checkpoint.ErrNotFound, p.Name)
		case !slices.Equal(got, p.Shape):
			return weights.Weights{}, fmt.Errorf("runmodel: %s: %w: tensor %q has shape %v, the model's is %v", path, checkpoint.ErrShapeMismatch, p.Name, got, p.Shape)
		}
		delete(held, p.Name)
	}
	for name := range held {
		return weights.Weights{}, fmt.Errorf("runmodel: %s: tensor %q is not the %s model's", path, name, c.Arch)
	}
	w, err := shape.InPieces(pieces, func(k, off int, dst []float32) error { return f.Read(pieces[k].Name, off, dst) })
	if err != nil {
		return weights.Weights{}, err
	}
	w.Release, opened = f.Close, true
	return w, nil
}

// LoadHFChecked loads a Hugging Face Llama directory, asking accept about
// its config.json before building the model.
func LoadHFChecked(ctx context.Context, d llama.Dir, be kernels.Backend, accept Accept) (*llama.Model, error) {
	return llama.LoadHFChecked(ctx, d, be, func(c llama.Config) error {
		return accept.check(modelspec.Config{Arch: coordinator.ArchLlama, Llama: c})
	})
}
