package gpt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/psyche-go/psyche/trainer/kernels"
)

// TestHash checks the hash against the layout it documents, written out
// plainly, and that it follows the parameters and nothing else.
func TestHash(t *testing.T) {
	m, err := New(tiny, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	u64 := func(v int) { _ = binary.Write(&b, binary.LittleEndian, uint64(v)) }
	for i, s := range tiny.Specs() {
		u64(len(s.Name))
		b.WriteString(s.Name)
		u64(len(s.Shape))
		for _, d := range s.Shape {
			u64(d)
		}
		u64(4 * len(m.Tensors()[i]))
		for _, v := range m.Tensors()[i] {
			_ = binary.Write(&b, binary.LittleEndian, math.Float32bits(v))
		}
	}
	if got, want := m.Hash(), sha256.Sum256(b.Bytes()); got != want {
		t.Fatalf("Hash = %x, the documented layout hashes to %x", got, want)
	}

	// Saved and loaded (with metadata, which is not hashed): the same hash.
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := m.Save(context.Background(), path, map[string]string{"step": "3"}); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.Hash() != m.Hash() {
		t.Fatal("a saved and loaded model hashes differently")
	}
	// One parameter's last bit changes it.
	m.Params[len(m.Params)/2] = math.Float32frombits(math.Float32bits(m.Params[len(m.Params)/2]) ^ 1)
	if loaded.Hash() == m.Hash() {
		t.Fatal("a changed parameter kept the hash")
	}
}

// The initial weights are a function of the config and the seed alone: not
// of the kernels backend (every trainer of a run derives the same model from
// seed:N whatever it computes on), and not of the Go release, which the
// pinned hash below guards (a new release changing math/rand/v2's normal
// variates would fail here before it made trainers refuse each other's
// runs).
func TestNewIsDeterministic(t *testing.T) {
	a, _ := New(tiny, 1, kernels.OnHost(kernels.Go{}))
	b, _ := New(tiny, 1, kernels.Default())
	if !slices.Equal(a.Params, b.Params) {
		t.Fatalf("seed 1 draws other weights on %s than on %s", kernels.Default().Name(), kernels.Go{}.Name())
	}
	c, _ := New(tiny, 2, nil)
	if slices.Equal(a.Params, c.Params) {
		t.Fatal("seeds 1 and 2 draw the same weights")
	}
	const want = "13a9b9e6c4f3eb67c63f0411dc69362ac7d8c72ef17c76b829e839d4917c8491"
	if got := a.Hash(); hex.EncodeToString(got[:]) != want {
		t.Fatalf("New(tiny, 1) hashes to %x, was %s", got, want)
	}
}

// TestHFLayoutIsPinned: the Hugging Face layout (modelspec's HFPieces: names,
// shapes, transposed Conv1D weights) hashes as the hand-written layout it
// replaced did, so files written before and after hold the same tensors.
func TestHFLayoutIsPinned(t *testing.T) {
	m, _ := New(tiny, 1, nil)
	const want = "da9c3d9914c4ebbf0989087a6728365415ebab82f9da51c426d73806ff2d5c2c"
	if got := checkpoint.HashTensors(m.HFTensors()); hex.EncodeToString(got[:]) != want {
		t.Fatalf("New(tiny, 1)'s Hugging Face tensors hash to %x, was %s", got, want)
	}
}
