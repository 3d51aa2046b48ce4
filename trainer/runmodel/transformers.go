package runmodel

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/weights"
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
	if rev := coordinator.FixedString(m.Checkpoint.Source.Revision[:]); weights.IsHash(rev) {
		if got := modelspec.ConfigHash(data); got != rev {
			return nil, fmt.Errorf("%w: the config %s hashes to %s, the run records %s (it was edited after the run was made)", weights.ErrRevision, path, got, rev)
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

// CheckpointTensors are the named tensors (sharing the model's memory) in
// the order of their names: the order of a safetensors file, so that a
// model has one hash and one P2P manifest whether it came out of an engine
// (which holds transformers' order) or was read from a saved directory.
func (t *Transformers) CheckpointTensors() []checkpoint.Tensor {
	out := make([]checkpoint.Tensor, len(t.values))
	for i := range t.values {
		out[i] = checkpoint.Tensor{Name: t.names[i], Shape: t.shapes[i], Data: t.values[i]}
	}
	slices.SortFunc(out, func(a, b checkpoint.Tensor) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Save writes a Hugging Face directory (saveTransformers).
func (t *Transformers) Save(ctx context.Context, dir string, _ map[string]string) error {
	if !t.Drawn() {
		return errors.New("runmodel: a transformers model not drawn yet has no weights to save")
	}
	return saveTransformers(ctx, dir, t.JSON, t.CheckpointTensors())
}

// Hash is the hash of the model's config.json (byte for byte) and its
// named tensors (weights.TransformersHash).
func (t *Transformers) Hash() [sha256.Size]byte {
	return weights.TransformersHash(t.JSON, checkpoint.HashTensors(t.CheckpointTensors()))
}

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
var ErrTransformersSource = errors.New("runmodel: a transformers run starts from seed:N@PATH (PATH its config.json) or a checkpoint directory on this machine (file://)")

// LoadRunTransformers is the Transformers model the run's checkpoint source
// names: seed:N@PATH, its config read and checked (LoadTransformersConfig),
// to be drawn by the engine; or a directory (file://) a checkpointer saved
// (Save), its config.json and weights read, which the caller checks against
// the run's revision (CheckRevision).
func LoadRunTransformers(m *coordinator.Model) (*Transformers, error) {
	t, dir, err := RunTransformersConfig(m)
	if err != nil || dir == "" {
		return t, err
	}
	path, err := transformersWeights(dir)
	if err != nil {
		return nil, err
	}
	ck, err := checkpoint.Load(path)
	if err != nil {
		return nil, fmt.Errorf("runmodel: %s: %w", dir, err)
	}
	names := ck.Names()
	shapes, values := make([][]int, len(names)), make([][]float32, len(names))
	for i, ct := range ck.Tensors() {
		shapes[i], values[i] = ct.Shape, ct.Data
	}
	return t.WithTensors(names, shapes, values)
}

// RunTransformersConfig is the Transformers model the run's checkpoint
// source names, its config read and checked but no weights: what an
// engine describes. dir is the checkpoint directory the source names (empty
// for seed:N@PATH).
func RunTransformersConfig(m *coordinator.Model) (t *Transformers, dir string, err error) {
	url := coordinator.FixedString(m.Checkpoint.Source.URL[:])
	src, err := modelspec.ParseSource(url)
	if err != nil {
		return nil, "", err
	}
	switch {
	case src.Kind == modelspec.FromSeed && src.Config != "":
		t, err := LoadTransformersConfig(src.Config, m, src.Seed)
		return t, "", err
	case src.Kind == modelspec.FromFile:
		// The revision is the hash of the config and the weights
		// (Hash), checked once they are read (CheckRevision): here the
		// config is checked against the run's shape.
		data, err := readSmallFile(filepath.Join(src.Path, "config.json"), 1<<20)
		if err != nil {
			return nil, "", fmt.Errorf("runmodel: the run's transformers checkpoint: %w", err)
		}
		t, err := NewTransformers(data, int(m.MaxSeqLen), 0)
		if err != nil {
			return nil, "", fmt.Errorf("runmodel: %s: %w", src.Path, err)
		}
		want, err := modelspec.Transformers(m)
		if err != nil {
			return nil, "", err
		}
		if err := modelspec.Compare(modelspec.Config{Arch: coordinator.ArchTransformers, Transformers: t.Config},
			modelspec.Config{Arch: coordinator.ArchTransformers, Transformers: want}); err != nil {
			return nil, "", fmt.Errorf("runmodel: %s: %w", src.Path, err)
		}
		return t, src.Path, nil
	}
	return nil, "", fmt.Errorf("%w (the run names %s)", ErrTransformersSource, url)
}

// transformersWeights is the path of the weights file in the Hugging Face
// checkpoint directory dir, or a one-line error saying what is wrong.
// A missing file stays an fs.ErrNotExist: a node waits for a trainer that
// holds the directory to offer it.
func transformersWeights(dir string) (string, error) {
	path := filepath.Join(dir, "model.safetensors")
	_, err := os.Stat(path)
	if err == nil {
		return path, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("runmodel: the run's transformers checkpoint: %w", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, "model.safetensors.index.json")); serr == nil {
		return "", fmt.Errorf("runmodel: %s holds its weights in shards (model.safetensors.index.json), which psyche does not read: "+
			"save it as one file (save_pretrained(dir, max_shard_size=\"1000GB\"))", dir)
	}
	return "", fmt.Errorf("runmodel: %s has no model.safetensors: a transformers run starts from a directory with config.json and model.safetensors (what save_pretrained writes) (%w)", dir, fs.ErrNotExist)
}

// CheckTransformersDir says, from the header of the directory's weights
// file alone (nothing else is read), whether the checkpoint directory dir
// holds exactly the tensors transformers builds from its config (names and
// shapes, as an engine describes them): a one-line error (weights.MatchTensors)
// naming the first that differs.
func CheckTransformersDir(dir string, names []string, shapes [][]int) error {
	path, err := transformersWeights(dir)
	if err != nil {
		return err
	}
	infos, err := checkpoint.Limits{}.LoadHeader(path)
	if err != nil {
		return fmt.Errorf("runmodel: %s: %w", dir, err)
	}
	haveNames, haveShapes := make([]string, len(infos)), make([][]int, len(infos))
	for i, ti := range infos {
		haveNames[i], haveShapes[i] = ti.Name, ti.Shape
	}
	if err := weights.MatchTensors(haveNames, haveShapes, names, shapes); err != nil {
		return fmt.Errorf("%w (%s)", err, path)
	}
	return nil
}
