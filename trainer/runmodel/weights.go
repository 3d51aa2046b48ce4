package runmodel

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/f32le"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

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
	// (HostWeights): an engine that computes in this process (the Go
	// engine) trains it as it is, rather than a copy.
	Host Model
	// seeded: Read draws the values New(Config, Seed) holds (Seeded).
	seeded bool
	// close releases what Read reads from (Close).
	close func() error
}

// Close releases what the weights are read from (a checkpoint's open
// files: OpenChecked); weights held in memory or drawn from a seed have
// nothing to release. They cannot be read afterwards.
func (w Weights) Close() error {
	if w.close == nil {
		return nil
	}
	return w.close()
}

// Seeded are the weights New(c, seed) draws, read a range at a time
// without ever being held whole (lm.Seeded): for an engine that holds the
// model elsewhere (a PyTorch worker), a model of gigabytes never exists in
// this process. An engine that computes here gets New's model (Model).
func Seeded(c modelspec.Config, seed uint64) (Weights, error) {
	w, err := Shape(c)
	if err != nil {
		return Weights{}, err
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
		return Weights{}, err
	}
	w.Seed, w.seeded = seed, true
	w.Read = func(ctx context.Context, i, off int, dst []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return draws.Read(i, off, dst)
	}
	return w, nil
}

// Shape are weights of a GPT or Llama config with no values yet (Read is
// nil): their shapes, for a file to give them values (InFile).
func Shape(c modelspec.Config) (Weights, error) {
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
		return Weights{}, fmt.Errorf("%w: %d has its shapes from its engine", modelspec.ErrArchitecture, c.Arch)
	}
	if err != nil {
		return Weights{}, err
	}
	return Weights{Config: c, Shapes: shapes}, nil
}

// Drawn says whether the weights hold values (Read), rather than a seed an
// engine draws them from.
func (w Weights) Drawn() bool { return w.Read != nil }

// HostWeights are the weights of a model in this process, read from its
// tensors.
func HostWeights(m Model) (Weights, error) {
	c, err := ConfigOf(m)
	if err != nil {
		return Weights{}, err
	}
	tensors := m.Tensors()
	w := Weights{Config: c, Shapes: m.Shapes(), Host: m, Read: func(_ context.Context, i, off int, dst []float32) error {
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

// errNotDrawn is the refusal to save or hash a transformers model whose
// weights an engine has not drawn yet.
var errNotDrawn = errors.New("runmodel: a transformers model not drawn yet has no weights")

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
	w.Host, w.seeded = nil, false
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
	return w.readPieces(pieces, func(k, off int, dst []float32) error {
		buf = slices.Grow(buf[:0], 4*len(dst))[:4*len(dst)]
		if _, err := r.ReadAt(buf, at[k]+4*int64(off)); err != nil {
			return err
		}
		f32le.Decode(dst, buf)
		return nil
	})
}

// readPieces are weights of the same model whose values are read a piece
// at a time: piece k's values [off, off+len(dst)) by read. Pieces must not
// be transposed (only a Hugging Face GPT-2 file's are).
func (w Weights) readPieces(pieces []modelspec.Piece, read func(k, off int, dst []float32) error) (Weights, error) {
	byParam := make([][]int, len(w.Shapes))
	for k, p := range pieces {
		if p.Transposed {
			return Weights{}, fmt.Errorf("runmodel: piece %s is transposed", p.Name)
		}
		byParam[p.Tensor] = append(byParam[p.Tensor], k)
	}
	w.Host, w.seeded = nil, false
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
				return fmt.Errorf("runmodel: reading %s: %w", p.Name, err)
			}
			if j := slices.IndexFunc(out, notFinite); j >= 0 {
				return fmt.Errorf("runmodel: %s holds %v at %d", p.Name, out[j], lo-p.Offset+j)
			}
		}
		return nil
	}
	return w, nil
}

func notFinite(v float32) bool { return math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) }

// Model is a model in this process holding the weights: Host itself, or a
// model of their config that every tensor is read into (a copy, for the
// engines that compute here and for tests).
func (w Weights) Model(ctx context.Context, be kernels.Backend) (Model, error) {
	if w.Host != nil {
		return w.Host, nil
	}
	if w.seeded {
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
		return nil, errNotDrawn
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

// Pieces are the tensors of the checkpoint file the weights are saved as
// (hf: a Hugging Face directory, as Save decides) and hashed and offered to
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
			return nil, fmt.Errorf("runmodel: %d names for %d tensors", len(w.Names), len(w.Shapes))
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
		return nil, errNotDrawn
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

// Hash is the model's hash (Model.Hash), its values read a chunk at a time.
func (w Weights) Hash(ctx context.Context) ([sha256.Size]byte, error) {
	tensors, err := w.Tensors(false)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	sum, err := checkpoint.Hash(ctx, tensors)
	if err != nil || w.Config.Arch != coordinator.ArchTransformers {
		return sum, err
	}
	return transformersHash(w.JSON, sum), nil
}

// Revision is the run revision that names the model (Revision).
func (w Weights) Revision(ctx context.Context) (string, error) {
	sum, err := w.Hash(ctx)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(sum[:revisionLen/2]), nil
}

// Save writes the weights as Save writes a model: a Hugging Face directory
// when hf is set or the model is a Llama or a transformers model, otherwise
// one safetensors file with meta in its header.
func (w Weights) Save(ctx context.Context, path string, hf bool, meta map[string]string) error {
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

// SaveFile writes GPT or Llama weights as one safetensors file with meta in
// its header, as a model's Save does (a Llama's Save writes a Hugging Face
// directory; this its single file).
func (w Weights) SaveFile(ctx context.Context, path string, meta map[string]string) error {
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

// transformersHash is a transformers model's hash: its config.json (byte
// for byte) and its named tensors' hash (checkpoint.HashTensors). Two
// directories with the same weights but configs that differ in a field the
// run's shape does not record (a norm's epsilon, the rope's base) compute
// different functions, so they are different models.
func transformersHash(json []byte, tensors [sha256.Size]byte) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte("psyche transformers model\x00"))
	h.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(json))))
	h.Write(json)
	h.Write(tensors[:])
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
