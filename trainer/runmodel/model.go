package runmodel

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/llama"
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

// Config is the shape of a model of either architecture: Arch says which
// of GPT and Llama applies (the other is zero). It is comparable, so a node
// can tell whether the model it holds is the run's.
type Config struct {
	Arch  coordinator.Architecture
	GPT   gpt.Config
	Llama llama.Config
}

// NumParams is the number of parameters.
func (c Config) NumParams() int {
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.NumParams()
	}
	return c.GPT.NumParams()
}

// Layers is the number of transformer blocks.
func (c Config) Layers() int {
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.Layers
	}
	return c.GPT.Layers
}

// Context is the longest sequence the model takes.
func (c Config) Context() int {
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.Context
	}
	return c.GPT.Context
}

// ConfigOf is the config of a model; a model of a type this package does
// not build wraps ErrArchitecture.
func ConfigOf(m Model) (Config, error) {
	switch m := m.(type) {
	case *gpt.Model:
		return Config{Arch: coordinator.ArchGPT, GPT: m.Config}, nil
	case *llama.Model:
		return Config{Arch: coordinator.ArchLlama, Llama: m.Config}, nil
	}
	return Config{}, fmt.Errorf("%w: a model of type %T", ErrArchitecture, m)
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
	}
	return fmt.Errorf("%w: a model of type %T", ErrArchitecture, m)
}

// SavesHF says whether Save writes m as a Hugging Face directory rather
// than one file.
func SavesHF(c Config, hf bool) bool { return hf || c.Arch == coordinator.ArchLlama }

// Llama is the Llama config the run describes, failing (wrapping
// ErrArchitecture) for another architecture. A run trains with RMSNorm's
// default ε (llama.DefaultNormEps): the account has no field for it.
func Llama(m *coordinator.Model) (llama.Config, error) {
	if m.Architecture != coordinator.ArchLlama {
		return llama.Config{}, fmt.Errorf("%w: %d is not %d, Llama", ErrArchitecture, m.Architecture, coordinator.ArchLlama)
	}
	c := llama.Config{Vocab: int(m.VocabSize), Context: int(m.MaxSeqLen), Width: int(m.DModel), Layers: int(m.NLayers),
		Heads: int(m.NHeads), KVHeads: int(m.NKVHeads), Intermediate: int(m.IntermediateSize), RopeTheta: m.RopeTheta,
		TiedHead: m.TiedHead}
	if err := c.Validate(); err != nil {
		return llama.Config{}, fmt.Errorf("runmodel: the run's model: %w", err)
	}
	return c, nil
}

// SetLlama writes c into the architecture and shape fields of m.
func SetLlama(m *coordinator.Model, c llama.Config) {
	m.Architecture = coordinator.ArchLlama
	m.VocabSize, m.MaxSeqLen = uint32(c.Vocab), uint32(c.Context)
	m.DModel, m.NLayers, m.NHeads = uint32(c.Width), uint32(c.Layers), uint32(c.Heads)
	m.NKVHeads, m.IntermediateSize, m.RopeTheta, m.TiedHead = uint32(c.KVHeads), uint32(c.Intermediate), c.RopeTheta, c.TiedHead
}

// ModelConfig is the config of the network the run describes, of whichever
// architecture it names; any other wraps ErrArchitecture.
func ModelConfig(m *coordinator.Model) (Config, error) {
	switch m.Architecture {
	case coordinator.ArchGPT:
		c, err := GPT(m)
		return Config{Arch: coordinator.ArchGPT, GPT: c}, err
	case coordinator.ArchLlama:
		c, err := Llama(m)
		return Config{Arch: coordinator.ArchLlama, Llama: c}, err
	}
	return Config{}, fmt.Errorf("%w: %d (this trainer builds %d, GPT, and %d, Llama)", ErrArchitecture, m.Architecture, coordinator.ArchGPT, coordinator.ArchLlama)
}

// New builds a model of config c with initial weights drawn from seed.
func New(c Config, seed uint64, be kernels.Backend) (Model, error) {
	switch c.Arch {
	case coordinator.ArchGPT:
		return gpt.New(c.GPT, seed, be)
	case coordinator.ArchLlama:
		return llama.New(c.Llama, seed, be)
	}
	return nil, fmt.Errorf("%w: %d", ErrArchitecture, c.Arch)
}

// Accept vets the config a checkpoint describes before anything is
// allocated for its model: a checkpoint from elsewhere (a URL an elected
// checkpointer recorded) may describe any size, and a trainer allocates only
// for the run's model (Compare). Nil accepts every config.
type Accept func(Config) error

func (a Accept) check(c Config) error {
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
		if err := accept.check(Config{Arch: coordinator.ArchLlama, Llama: c}); err != nil {
			return nil, err
		}
		return llama.FromCheckpoint(ck, be)
	}
	c, err := gpt.ConfigFromCheckpoint(mc)
	if err != nil {
		return nil, err
	}
	if err := accept.check(Config{Arch: coordinator.ArchGPT, GPT: c}); err != nil {
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
				return accept.check(Config{Arch: coordinator.ArchGPT, GPT: c})
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

// LoadHFChecked loads a Hugging Face Llama directory, asking accept about
// its config.json before building the model.
func LoadHFChecked(ctx context.Context, d llama.Dir, be kernels.Backend, accept Accept) (*llama.Model, error) {
	return llama.LoadHFChecked(ctx, d, be, func(c llama.Config) error {
		return accept.check(Config{Arch: coordinator.ArchLlama, Llama: c})
	})
}
