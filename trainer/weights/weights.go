// Package weights owns a model's parameters as named tensors read a range
// at a time wherever they are held (an engine's device, a checkpoint file,
// a seed, a model in this process), and what is computed from them without
// building the model: the checkpoint layout they are saved and offered as
// (Pieces, Tensors), their hash and the run revision it names (Hash,
// Revision, CheckRevision), and reorderings and re-sourcings that keep
// nothing whole in memory (InOrder, InFile).
//
// It imports no model implementation and no kernels: the engine seam
// (trainer/engine) hands models across as Weights, and trainer/runmodel,
// which builds GPT, Llama and transformers models, makes Weights of them
// and models and files of Weights.
package weights

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/f32le"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// HostModel is a model in this process whose tensors the weights read
// (runmodel.Model is one).
type HostModel interface {
	Tensors() [][]float32
	Shapes() [][]int
}

// Weights are a model's parameters wherever they are held (a host model, an
// engine's device) and what writing or hashing them takes besides: the
// config, a transformers model's config.json and tensor names. A checkpoint
// of them is written and hashed a piece at a time (modelspec.Piece), each
// read as it is needed, so a model held by a worker is never copied whole
// into this process.
type Weights struct {
	Config modelspec.Config
	// Shapes are the parameter tensors' shapes, in the order Read
	// addresses them (the model's Shapes).
	Shapes [][]int
	// Names and JSON describe a transformers model: its tensors' names
	// (Shapes' order) and its config.json, byte for byte.
	Names []string
	JSON  []byte
	// Read copies values [off, off+len(dst)) of tensor i into dst. It is
	// nil for a transformers model not drawn yet, which the engine that
	// opens it draws from Seed (its names and shapes are then the
	// engine's to say).
	Read func(ctx context.Context, i, off int, dst []float32) error
	Seed uint64
	// Host is the model in this process the weights are read from
	// (runmodel.HostWeights): an engine that computes in this process (the
	// Go engine) trains it as it is, rather than a copy.
	Host HostModel
	// Seeded says Read draws the values of the model runmodel.New builds
	// from Config and Seed (runmodel.Seeded): an engine that computes in
	// this process builds that model rather than reading it.
	Seeded bool
	// Release releases what Read reads from (Close); nil when the values
	// are in memory or drawn.
	Release func() error
}

// Close releases what the weights are read from (a checkpoint's open
// files: runmodel.OpenChecked); weights held in memory or drawn from a seed have
// nothing to release. They cannot be read afterwards.
func (w Weights) Close() error {
	if w.Release == nil {
		return nil
	}
	return w.Release()
}

// Drawn says whether the weights hold values (Read), rather than a seed an
// engine draws them from.
func (w Weights) Drawn() bool { return w.Read != nil }

// ErrNotDrawn is the refusal to save or hash a transformers model whose
// weights an engine has not drawn yet.
var ErrNotDrawn = errors.New("weights: a transformers model not drawn yet has no weights")

// InOrder are the same weights addressed in the order of names (a
// transformers model's, as an engine describes it), failing unless they
// hold exactly those tensors with those shapes (MatchTensors).
func (w Weights) InOrder(names []string, shapes [][]int) (Weights, error) {
	if err := MatchTensors(w.Names, w.Shapes, names, shapes); err != nil {
		return Weights{}, err
	}
	at := make(map[string]int, len(w.Names))
	for i, n := range w.Names {
		at[n] = i
	}
	from := make([]int, len(names))
	for j, n := range names {
		from[j] = at[n]
	}
	read := w.Read
	w.Names, w.Shapes = slices.Clone(names), shapes
	w.Read = func(ctx context.Context, i, off int, dst []float32) error { return read(ctx, from[i], off, dst) }
	// The host model's own order, or New's, is no longer the weights'.
	w.Host, w.Seeded = nil, false
	return w, nil
}

// InFile are weights of the same model whose values are those r holds:
// the checkpoint tensors (Pieces(false)) back to back, each as
// little-endian float32, the layout a P2P checkpoint carries. Each such
// piece is a run of one parameter's values in their own order, so reading
// a range of a parameter is one read of r for each piece it overlaps, and
// nothing is held. A value that is not finite fails the read.
func (w Weights) InFile(r io.ReaderAt) (Weights, error) {
	pieces, err := w.Pieces(false)
	if err != nil {
		return Weights{}, err
	}
	at := make([]int64, len(pieces))
	end := int64(0)
	for k, p := range pieces {
		at[k], end = end, end+4*int64(modelspec.Size(p.Shape))
	}
	var buf []byte
	return w.InPieces(pieces, func(k, off int, dst []float32) error {
		buf = slices.Grow(buf[:0], 4*len(dst))[:4*len(dst)]
		if _, err := r.ReadAt(buf, at[k]+4*int64(off)); err != nil {
			return err
		}
		f32le.Decode(dst, buf)
		return nil
	})
}

// InPieces are weights of the same model whose values are read a piece
// at a time: piece k's values [off, off+len(dst)) by read. Pieces must not
// be transposed (only a Hugging Face GPT-2 file's are).
func (w Weights) InPieces(pieces []modelspec.Piece, read func(k, off int, dst []float32) error) (Weights, error) {
	byParam := make([][]int, len(w.Shapes))
	for k, p := range pieces {
		if p.Transposed {
			return Weights{}, fmt.Errorf("weights: piece %s is transposed", p.Name)
		}
		byParam[p.Tensor] = append(byParam[p.Tensor], k)
	}
	w.Host, w.Seeded = nil, false
	var mu sync.Mutex // read may reuse a buffer
	w.Read = func(ctx context.Context, i, off int, dst []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, k := range byParam[i] {
			p := pieces[k]
			lo, hi := max(off, p.Offset), min(off+len(dst), p.Offset+modelspec.Size(p.Shape))
			if lo >= hi {
				continue
			}
			out := dst[lo-off : hi-off]
			if err := read(k, lo-p.Offset, out); err != nil {
				return fmt.Errorf("weights: reading %s: %w", p.Name, err)
			}
			if j := slices.IndexFunc(out, notFinite); j >= 0 {
				return fmt.Errorf("weights: %s holds %v at %d", p.Name, out[j], lo-p.Offset+j)
			}
		}
		return nil
	}
	return w, nil
}

func notFinite(v float32) bool { return math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) }

// Pieces are the tensors of the checkpoint file the weights are saved as
// (hf: a Hugging Face directory, as runmodel.SaveWeights decides) and hashed and offered to
// peers as (the model's own layout: CheckpointTensors'). They need the
// weights' shapes, not their values.
func (w Weights) Pieces(hf bool) ([]modelspec.Piece, error) {
	var p []modelspec.Piece
	switch w.Config.Arch {
	case coordinator.ArchGPT:
		p = w.Config.GPT.Pieces()
		if hf {
			p = w.Config.GPT.HFPieces()
		}
	case coordinator.ArchLlama:
		p = w.Config.Llama.Pieces()
	case coordinator.ArchTransformers:
		if len(w.Names) != len(w.Shapes) {
			return nil, fmt.Errorf("weights: %d names for %d tensors", len(w.Names), len(w.Shapes))
		}
		// A transformers checkpoint lists its tensors by name.
		p = modelspec.WholePieces(w.Names, w.Shapes)
		slices.SortFunc(p, func(a, b modelspec.Piece) int { return strings.Compare(a.Name, b.Name) })
	default:
		return nil, fmt.Errorf("%w: %d", modelspec.ErrArchitecture, w.Config.Arch)
	}
	return p, modelspec.CheckPieces(p, w.Shapes)
}

// Tensors are the checkpoint's tensors (Pieces), each read when it is
// written or hashed: a piece is read in the chunks asked for, a transposed
// one whole (a GPT layer's matrix) and kept until the next piece.
func (w Weights) Tensors(hf bool) ([]checkpoint.Tensor, error) {
	if !w.Drawn() {
		return nil, ErrNotDrawn
	}
	pieces, err := w.Pieces(hf)
	if err != nil {
		return nil, err
	}
	out := make([]checkpoint.Tensor, len(pieces))
	var held struct {
		piece  int
		values []float32
	}
	held.piece = -1
	for k, p := range pieces {
		fill := func(ctx context.Context, off int, dst []float32) error {
			return w.Read(ctx, p.Tensor, p.Offset+off, dst)
		}
		if p.Transposed {
			fill = func(ctx context.Context, off int, dst []float32) error {
				if held.piece != k {
					v := make([]float32, modelspec.Size(p.Shape))
					if err := w.Read(ctx, p.Tensor, p.Offset, v); err != nil {
						return err
					}
					held.piece, held.values = k, modelspec.Transpose(v, p.Shape[1], p.Shape[0])
				}
				copy(dst, held.values[off:])
				return nil
			}
		}
		out[k] = checkpoint.Tensor{Name: p.Name, Shape: p.Shape, Fill: fill}
	}
	return out, nil
}

// Hash is the model's hash (what runmodel.Model's Hash computes in
// memory), its values read a chunk at a time.
func (w Weights) Hash(ctx context.Context) ([sha256.Size]byte, error) {
	tensors, err := w.Tensors(false)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	sum, err := checkpoint.Hash(ctx, tensors)
	if err != nil || w.Config.Arch != coordinator.ArchTransformers {
		return sum, err
	}
	return TransformersHash(w.JSON, sum), nil
}

// Revision is the run revision that names the model: the first 16 bytes
// of its hash as 32 lowercase hex digits, which fill the account's 32-byte
// field (128 bits: no one finds another model with the same ones).
func (w Weights) Revision(ctx context.Context) (string, error) {
	sum, err := w.Hash(ctx)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(sum[:coordinator.RevisionLen/2]), nil
}

// TransformersHash is a transformers model's hash: its config.json (byte
// for byte) and its named tensors' hash (checkpoint.HashTensors). Two
// directories with the same weights but configs that differ in a field the
// run's shape does not record (a norm's epsilon, the rope's base) compute
// different functions, so they are different models.
func TransformersHash(json []byte, tensors [sha256.Size]byte) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte("psyche transformers model\x00"))
	h.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(json))))
	h.Write(json)
	h.Write(tensors[:])
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// MatchTensors says in one line how the tensors a checkpoint holds (have,
// by name) differ from those transformers builds from the config (names
// and shapes): the first tensor missing, misshapen or extra, and how many
// are. Nil means the same names with the same shapes.
func MatchTensors(haveNames []string, haveShapes [][]int, names []string, shapes [][]int) error {
	have := make(map[string][]int, len(haveNames))
	for i, n := range haveNames {
		have[n] = haveShapes[i]
	}
	want := make(map[string]bool, len(names))
	var missing, misshapen []int
	for j, n := range names {
		want[n] = true
		s, ok := have[n]
		switch {
		case !ok:
			missing = append(missing, j)
		case !slices.Equal(s, shapes[j]):
			misshapen = append(misshapen, j)
		}
	}
	var extra []string
	for _, n := range haveNames {
		if !want[n] {
			extra = append(extra, n)
		}
	}
	slices.Sort(extra)
	more := func(n int, what string) string {
		if n <= 1 {
			return ""
		}
		return fmt.Sprintf(" (and %d more %s)", n-1, what)
	}
	const fix = "the checkpoint is not of this config.json's model: start from its own config.json, or save the model with this one"
	switch {
	case len(missing) > 0:
		j := missing[0]
		return fmt.Errorf("weights: the checkpoint has no tensor %s %v, which transformers builds from the config%s; %s",
			names[j], shapes[j], more(len(missing), "missing"), fix)
	case len(misshapen) > 0:
		j := misshapen[0]
		return fmt.Errorf("weights: tensor %s is %v in the checkpoint, transformers builds it %v from the config%s; %s",
			names[j], have[names[j]], shapes[j], more(len(misshapen), "of another shape"), fix)
	case len(extra) > 0:
		return fmt.Errorf("weights: the checkpoint's tensor %s %v is not one transformers builds from the config%s; %s",
			extra[0], have[extra[0]], more(len(extra), "extra"), fix)
	}
	return nil
}

// IsHash reports whether a run's revision is a model hash (exactly 32
// lowercase hex digits), which trainers check, rather than a free label
// (empty, "v1", a commit name), which they do not.
func IsHash(revision string) bool {
	if len(revision) != coordinator.RevisionLen {
		return false
	}
	for _, c := range revision {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ErrRevision means a loaded model is not the one the run records.
var ErrRevision = errors.New("weights: the model's hash is not the run's revision")

// RevisionError is a model whose hash differs from the run's revision. It
// matches ErrRevision.
type RevisionError struct {
	From      string // where the model came from
	Got, Want string // its revision, and the run's
}

func (e *RevisionError) Error() string {
	return fmt.Sprintf("the model from %s has hash %s, the run records %s", e.From, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrRevision) hold.
func (e *RevisionError) Is(target error) bool { return target == ErrRevision }

// CheckRevision applies the run's revision rule to the weights of a model
// loaded from the run's checkpoint URL from: a revision that is a hash
// (IsHash) must be theirs (a *RevisionError otherwise); any other revision
// is a label and is not checked. They are read and hashed a piece at a time
// (a seed's drawn as they are read).
func (w Weights) CheckRevision(ctx context.Context, from, revision string) error {
	if !IsHash(revision) || !w.Drawn() {
		// Not a model hash, or a seeded transformers run, whose revision
		// is its config's hash (runmodel.LoadTransformersConfig).
		return nil
	}
	got, err := w.Revision(ctx)
	if err != nil {
		return err
	}
	if got != revision {
		return &RevisionError{From: from, Got: got, Want: revision}
	}
	return nil
}
