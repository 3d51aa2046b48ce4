package runmodel

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// ErrComputesElsewhere is returned by a Transformers model asked to
// compute on the host: only the PyTorch engine builds its network.
var ErrComputesElsewhere = errors.New("runmodel: a transformers model computes only in the torch engine (join with --engine torch)")

// Transformers is a Hugging Face transformers causal LM as the host sees
// it: its config.json and its parameters as named tensors (the names of the
// model's state dict: what from_pretrained reads, what peers exchange).
// Psyche has no Go implementation of these networks, so the model cannot
// compute here (the compute methods fail with ErrComputesElsewhere): an
// engine builds it from the config and either draws the weights from Seed
// (Drawn false: the tensors are empty until the engine hands the model out)
// or copies these tensors in.
type Transformers struct {
	Config modelspec.TransformersConfig
	File   modelspec.TransformersFile
	JSON   []byte // config.json, byte for byte (its hash is the run's revision)
	Seed   uint64 // where the weights come from while Drawn is false
	names  []string
	shapes [][]int
	values [][]float32
}

var _ Model = (*Transformers)(nil)

// NewTransformers is the model the config.json data describes, for a run of
// context tokens a sequence, to be drawn from seed by the engine.
func NewTransformers(data []byte, context int, seed uint64) (*Transformers, error) {
	f, err := modelspec.ParseTransformersFile(data)
	if err != nil {
		return nil, err
	}
	c, err := f.Mirror(context)
	if err != nil {
		return nil, err
	}
	return &Transformers{Config: c, File: f, JSON: data, Seed: seed}, nil
}

// LoadTransformersConfig reads the config.json a run names (path, on this
// machine) and checks it against the run: its hash must be the revision
// when that is a hash, and its shape the account's.
func LoadTransformersConfig(path string, m *coordinator.Model, seed uint64) (*Transformers, error) {
	data, err := readSmallFile(path, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("runmodel: the run's transformers config: %w", err)
	}
	if rev := coordinator.FixedString(m.Checkpoint.Source.Revision[:]); IsHash(rev) {
		if got := modelspec.ConfigHash(data); got != rev {
			return nil, fmt.Errorf("%w: the config %s hashes to %s, the run records %s (it was edited after the run was made)", ErrRevision, path, got, rev)
		}
	}
	t, err := NewTransformers(data, int(m.MaxSeqLen), seed)
	if err != nil {
		return nil, fmt.Errorf("runmodel: %s: %w", path, err)
	}
	want, err := modelspec.Transformers(m)
	if err != nil {
		return nil, err
	}
	if err := modelspec.Compare(modelspec.Config{Arch: coordinator.ArchTransformers, Transformers: t.Config},
		modelspec.Config{Arch: coordinator.ArchTransformers, Transformers: want}); err != nil {
		return nil, fmt.Errorf("runmodel: %s: %w", path, err)
	}
	return t, nil
}

// Drawn says whether the model holds its weights (false: the engine draws
// them from Seed).
func (t *Transformers) Drawn() bool { return t.values != nil }

// WithTensors is the same model holding these named tensors (an engine's
// weights, or a peer's), which it takes without copying.
func (t *Transformers) WithTensors(names []string, shapes [][]int, values [][]float32) (*Transformers, error) {
	if len(names) != len(shapes) || len(names) != len(values) {
		return nil, fmt.Errorf("runmodel: %d names, %d shapes and %d tensors", len(names), len(shapes), len(values))
	}
	for i, v := range values {
		if modelspec.Size(shapes[i]) != len(v) {
			return nil, fmt.Errorf("runmodel: tensor %s of shape %v has %d values", names[i], shapes[i], len(v))
		}
	}
	out := *t
	out.names, out.shapes, out.values = names, shapes, values
	return &out, nil
}

// Names are the tensors' names, in the order of Tensors.
func (t *Transformers) Names() []string { return t.names }

func (t *Transformers) Forward(inputs, targets []uint32, b, n int) (float32, error) {
	return 0, ErrComputesElsewhere
}
func (t *Transformers) SequenceLosses(int) []float32 { return nil }
func (t *Transformers) Backward() error              { return ErrComputesElsewhere }
func (t *Transformers) ZeroGrad()                    {}
func (t *Transformers) Logits() []float32            { return nil }
func (t *Transformers) GradTensors() [][]float32     { return nil }
func (t *Transformers) Tensors() [][]float32         { return t.values }
func (t *Transformers) Shapes() [][]int              { return t.shapes }

// CheckpointTensors are the named tensors (sharing the model's memory).
func (t *Transformers) CheckpointTensors() []checkpoint.Tensor {
	out := make([]checkpoint.Tensor, len(t.values))
	for i := range t.values {
		out[i] = checkpoint.Tensor{Name: t.names[i], Shape: t.shapes[i], Data: t.values[i]}
	}
	return out
}

// Save writes a Hugging Face directory: the run's config.json as it was
// read and model.safetensors in F32 (so its hash is the model's), which
// AutoModelForCausalLM.from_pretrained loads (a tied head is not stored:
// the config's tie_word_embeddings ties it again).
func (t *Transformers) Save(ctx context.Context, dir string, _ map[string]string) error {
	if !t.Drawn() {
		return errors.New("runmodel: a transformers model not drawn yet has no weights to save")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("runmodel: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), t.JSON, 0o644); err != nil {
		return fmt.Errorf("runmodel: %w", err)
	}
	return checkpoint.Save(ctx, filepath.Join(dir, "model.safetensors"), t.CheckpointTensors(), map[string]string{"format": "pt"})
}

// Hash is the hash of the named tensors (checkpoint.HashTensors).
func (t *Transformers) Hash() [sha256.Size]byte { return checkpoint.HashTensors(t.CheckpointTensors()) }

// NumParams counts the values held (0 before the engine draws them).
func (t *Transformers) NumParams() int {
	n := 0
	for _, v := range t.values {
		n += len(v)
	}
	return n
}

// FLOPsPerToken is the usual 6N of a dense decoder's training step
// (attention's share left out: transformers' families differ in it).
func (t *Transformers) FLOPsPerToken(int) float64 { return 6 * float64(t.NumParams()) }

// ErrTransformersSource means a Transformers run's checkpoint source is not
// one a trainer can start it from.
var ErrTransformersSource = errors.New("runmodel: a transformers run starts from seed:N@PATH (PATH its config.json); loading its weights from a checkpoint URL is not supported yet")

// LoadRunTransformers is the Transformers model the run's checkpoint source
// names (seed:N@PATH), its config read and checked (LoadTransformersConfig).
func LoadRunTransformers(m *coordinator.Model) (*Transformers, error) {
	url := coordinator.FixedString(m.Checkpoint.Source.URL[:])
	src, err := modelspec.ParseSource(url)
	if err != nil {
		return nil, err
	}
	if src.Kind != modelspec.FromSeed || src.Config == "" {
		return nil, fmt.Errorf("%w (the run names %s)", ErrTransformersSource, url)
	}
	return LoadTransformersConfig(src.Config, m, src.Seed)
}
