package runmodel

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/f32le"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/weights"
)

// readCounter wraps a Weights' Read, keeping the largest read.
func readCounter(w *weights.Weights, largest *int) {
	read := w.Read
	w.Read = func(ctx context.Context, i, off int, dst []float32) error {
		*largest = max(*largest, len(dst))
		return read(ctx, i, off, dst)
	}
}

// sameFiles fails unless the two paths (files or directories) hold the
// same bytes.
func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	err := filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		other := b
		if rel != "." {
			other = filepath.Join(b, rel)
		}
		x, _ := os.ReadFile(p)
		y, err := os.ReadFile(other)
		if err != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s differs from %s (%v)", p, other, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestWeightsSaveAndHashAsTheModel: a model's weights read a chunk at a time
// (what an engine on a device hands out) save the same files and hash the
// same as the host model does, for every architecture and file form, and
// no read asks for more than a chunk, a piece or a transposed GPT matrix:
// the whole model is never asked for at once.
func TestWeightsSaveAndHashAsTheModel(t *testing.T) {
	ctx := context.Background()
	g, _ := gpt.New(modelspec.GPTConfig{Vocab: 300, Context: 16, Width: 128, Layers: 2, Heads: 4}, 1, nil)
	l, _ := llama.New(modelspec.LlamaConfig{Vocab: 300, Context: 16, Width: 128, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 256, RopeTheta: 10000}, 1, nil)
	lt, _ := llama.New(modelspec.LlamaConfig{Vocab: 300, Context: 16, Width: 128, Layers: 2, Heads: 4, KVHeads: 4, Intermediate: 256, RopeTheta: 10000, TiedHead: true}, 2, nil)
	tf, _ := NewTransformers([]byte(qwenJSON), 64, 1)
	names := []string{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
	shapes := [][]int{{256, 64}, {64}, {256, 64}}
	values := make([][]float32, len(shapes))
	for i, s := range shapes {
		values[i] = make([]float32, modelspec.Size(s))
		for j := range values[i] {
			values[i][j] = float32(i*7+j%13) / 10
		}
	}
	tfm, err := tf.WithTensors(names, shapes, values)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		m    Model
		hf   bool
	}{
		{"gpt", g, false},
		{"gpt hf", g, true},
		{"llama", l, false},
		{"llama tied", lt, true},
		{"transformers", tfm, true},
	} {
		w, err := HostWeights(tc.m)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		largest := 0
		readCounter(&w, &largest)
		if sum, err := w.Hash(ctx); err != nil || sum != tc.m.Hash() {
			t.Fatalf("%s: Weights.Hash = %x, %v; the model's %x", tc.name, sum, err, tc.m.Hash())
		}
		if rev, err := w.Revision(ctx); err != nil || rev != Revision(tc.m) {
			t.Fatalf("%s: Weights.Revision = %s, %v; the model's %s", tc.name, rev, err, Revision(tc.m))
		}
		dir := t.TempDir()
		meta := map[string]string{"run": "r", "step": "3"}
		if err := SaveWeights(ctx, w, filepath.Join(dir, "weights"), tc.hf, meta); err != nil {
			t.Fatalf("%s: SaveWeights: %v", tc.name, err)
		}
		if err := Save(ctx, tc.m, filepath.Join(dir, "model"), tc.hf, meta); err != nil {
			t.Fatalf("%s: Save: %v", tc.name, err)
		}
		sameFiles(t, filepath.Join(dir, "model"), filepath.Join(dir, "weights"))
		// A chunk of the writer's or the hasher's (a quarter million
		// values), or a transposed GPT matrix.
		if largest > 1<<18 || largest >= tc.m.NumParams()/2 {
			t.Fatalf("%s: a read of %d values (the model has %d)", tc.name, largest, tc.m.NumParams())
		}
	}
}

// TestWeightsReadFails: a read that fails fails the hash and the save, and
// the save leaves no model file; weights not drawn yet are neither saved
// nor hashed.
func TestWeightsReadFails(t *testing.T) {
	m, _ := gpt.New(modelspec.GPTConfig{Vocab: 11, Context: 6, Width: 8, Layers: 2, Heads: 2}, 1, nil)
	w, err := HostWeights(m)
	if err != nil {
		t.Fatal(err)
	}
	gone := errors.New("the worker exited")
	w.Read = func(context.Context, int, int, []float32) error { return gone }
	if _, err := w.Hash(context.Background()); !errors.Is(err, gone) {
		t.Fatalf("Hash = %v", err)
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := SaveWeights(context.Background(), w, path, false, nil); !errors.Is(err, gone) {
		t.Fatalf("Save = %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a failed save left %s (%v)", path, err)
	}
	// A transformers model not drawn yet: its seed, no values to save.
	tf, _ := NewTransformers([]byte(qwenJSON), 64, 1)
	tw, err := HostWeights(tf)
	if err != nil || tw.Drawn() || tw.Seed != 1 || string(tw.JSON) != qwenJSON {
		t.Fatalf("the weights of a transformers model not drawn yet: %+v, %v", tw, err)
	}
	if err := SaveWeights(context.Background(), tw, t.TempDir(), true, nil); !errors.Is(err, weights.ErrNotDrawn) {
		t.Fatalf("saving them: %v", err)
	}
	if _, err := tw.Hash(context.Background()); !errors.Is(err, weights.ErrNotDrawn) {
		t.Fatalf("hashing them: %v", err)
	}
}

// TestWeightsModel: weights read into a model of their own (what the Go
// engine does with weights from elsewhere, and a host copy of an engine's)
// hash as the model they came from; a host model's weights give the model
// itself; weights in another order read each name's own values.
func TestWeightsModel(t *testing.T) {
	ctx := context.Background()
	g, _ := gpt.New(modelspec.GPTConfig{Vocab: 11, Context: 6, Width: 8, Layers: 2, Heads: 2}, 1, nil)
	l, _ := llama.New(modelspec.LlamaConfig{Vocab: 11, Context: 6, Width: 16, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 12, RopeTheta: 10000}, 1, nil)
	for _, m := range []Model{g, l} {
		w, _ := HostWeights(m)
		if same, err := FromWeights(ctx, w, nil); err != nil || same != m {
			t.Fatalf("a host model's weights gave %T (%v), not the model", same, err)
		}
		w.Host = nil
		copied, err := FromWeights(ctx, w, nil)
		if err != nil || copied == m || copied.Hash() != m.Hash() {
			t.Fatalf("%T read into a model of its own: %v, same hash %v", m, err, err == nil && copied.Hash() == m.Hash())
		}
	}
	tf, _ := NewTransformers([]byte(qwenJSON), 64, 1)
	tfm, err := tf.WithTensors([]string{"b", "a"}, [][]int{{2}, {3}}, [][]float32{{1, 2}, {3, 4, 5}})
	if err != nil {
		t.Fatal(err)
	}
	w, _ := HostWeights(tfm)
	in, err := w.InOrder([]string{"a", "b"}, [][]int{{3}, {2}})
	if err != nil || in.Host != nil {
		t.Fatalf("InOrder: %v (host kept: %v)", err, in.Host != nil)
	}
	got := make([]float32, 3)
	if err := in.Read(ctx, 0, 0, got); err != nil || got[0] != 3 || got[2] != 5 {
		t.Fatalf("tensor a read as %v, %v", got, err)
	}
	back, err := FromWeights(ctx, in, nil)
	if err != nil || back.Hash() != tfm.Hash() {
		t.Fatalf("the reordered weights as a model: %v", err)
	}
	if _, err := w.InOrder([]string{"a", "c"}, [][]int{{3}, {2}}); err == nil {
		t.Fatal("InOrder accepted a name the weights lack")
	}
}

// Seeded weights read, in chunks of any size and in any order, exactly the
// values New draws from the same seed, and hash to New's revision; the
// model they give an engine that computes here is New's.
func TestSeededWeightsAreNewsModel(t *testing.T) {
	ctx := context.Background()
	for _, c := range []modelspec.Config{
		{Arch: coordinator.ArchGPT, GPT: gpt.Config{Vocab: 96, Context: 16, Width: 32, Layers: 2, Heads: 2}},
		{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 96, Context: 16, Width: 32, Layers: 2, Heads: 4, KVHeads: 2,
			Intermediate: 48, RopeTheta: 10000}},
		{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 96, Context: 16, Width: 32, Layers: 2, Heads: 4, KVHeads: 2,
			Intermediate: 48, RopeTheta: 10000, TiedHead: true}},
	} {
		want, err := New(c, 7, nil)
		if err != nil {
			t.Fatal(err)
		}
		w, err := Seeded(c, 7)
		if err != nil {
			t.Fatal(err)
		}
		tensors := want.Tensors()
		if len(w.Shapes) != len(tensors) {
			t.Fatalf("%v: %d shapes, New has %d tensors", c.Arch, len(w.Shapes), len(tensors))
		}
		// In order a few values at a time, then backwards tensor by
		// tensor (each read behind the stream starts it again).
		order := make([]int, 0, 2*len(tensors))
		for i := range tensors {
			order = append(order, i)
		}
		for i := len(tensors) - 1; i >= 0; i-- {
			order = append(order, i)
		}
		for _, i := range order {
			got := make([]float32, len(tensors[i]))
			for off := 0; off < len(got); off += 7 {
				if err := w.Read(ctx, i, off, got[off:min(off+7, len(got))]); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(got, tensors[i]) {
				t.Fatalf("%v: tensor %d differs from New's", c.Arch, i)
			}
		}
		if rev, err := w.Revision(ctx); err != nil || rev != Revision(want) {
			t.Errorf("%v: revision %q (%v), New's %q", c.Arch, rev, err, Revision(want))
		}
		m, err := FromWeights(ctx, w, nil)
		if err != nil || Revision(m) != Revision(want) {
			t.Errorf("%v: the model here is not New's (%v)", c.Arch, err)
		}
		if err := w.Read(ctx, 0, len(tensors[0])-1, make([]float32, 2)); err == nil {
			t.Errorf("%v: a read past a tensor's end was accepted", c.Arch)
		}
	}
	if _, err := Seeded(modelspec.Config{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 96}}, 1); err == nil {
		t.Error("an invalid config was accepted")
	}
}

// Weights read from a P2P checkpoint's bytes (each checkpoint piece in
// order, little-endian float32) are the model's: any range of a parameter,
// across the pieces it is cut into, the hash, and the model built from
// them. A value that is not finite fails the read that meets it; a GPT or
// Llama config gives its shapes without any values.
func TestWeightsInFile(t *testing.T) {
	ctx := context.Background()
	g, _ := gpt.New(modelspec.GPTConfig{Vocab: 300, Context: 16, Width: 64, Layers: 2, Heads: 4}, 3, nil)
	l, _ := llama.New(modelspec.LlamaConfig{Vocab: 300, Context: 16, Width: 64, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 96, RopeTheta: 10000}, 4, nil)
	for _, m := range []Model{g, l} {
		host, err := HostWeights(m)
		if err != nil {
			t.Fatal(err)
		}
		shape, err := Shape(host.Config)
		if err != nil || shape.Drawn() || !slices.EqualFunc(shape.Shapes, host.Shapes, slices.Equal) {
			t.Fatalf("Shape = %v drawn %v, %v; want the model's shapes, undrawn", shape.Shapes, shape.Drawn(), err)
		}
		var file []byte
		for _, ct := range m.CheckpointTensors() {
			file = f32le.Append(file, ct.Data)
		}
		w, err := shape.InFile(bytes.NewReader(file))
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range m.Tensors() {
			for _, r := range [][2]int{{0, len(want)}, {1, len(want) - 2}, {len(want) / 3, len(want)/3 + 5}} {
				got := make([]float32, r[1]-r[0])
				if err := w.Read(ctx, i, r[0], got); err != nil || !slices.Equal(got, want[r[0]:r[1]]) {
					t.Fatalf("%s tensor %d [%d, %d): %v", host.Config.Arch, i, r[0], r[1], err)
				}
			}
		}
		if sum, err := w.Hash(ctx); err != nil || sum != m.Hash() {
			t.Fatalf("%s: hash from the file %x, %v; the model's %x", host.Config.Arch, sum[:4], err, m.Hash())
		}
		back, err := FromWeights(ctx, w, nil)
		if err != nil || back.Hash() != m.Hash() {
			t.Fatalf("%s: the model built from the file differs (%v)", host.Config.Arch, err)
		}
		bad := slices.Clone(file)
		f32le.Put(bad[len(bad)-4:], []float32{float32(math.NaN())})
		w, _ = shape.InFile(bytes.NewReader(bad))
		if _, err := w.Hash(ctx); err == nil || !strings.Contains(err.Error(), "NaN") {
			t.Errorf("%s: a NaN in the file read as %v", host.Config.Arch, err)
		}
	}
	if _, err := Shape(modelspec.Config{Arch: coordinator.ArchTransformers}); !errors.Is(err, modelspec.ErrArchitecture) {
		t.Errorf("Shape of a transformers config: %v, want ErrArchitecture", err)
	}
}

// OpenChecked reads a Llama directory's and a GPT file's weights from
// their files (the hash is the saved model's, no host model behind them)
// and refuses another config before reading anything; a file without its
// model's metadata, or with a tensor the model lacks, is refused, and a
// value that is not finite fails the read that meets it.
func TestOpenChecked(t *testing.T) {
	ctx := context.Background()
	l, _ := llama.New(modelspec.LlamaConfig{Vocab: 300, Context: 16, Width: 64, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 96, RopeTheta: 10000}, 7, nil)
	g, _ := gpt.New(modelspec.GPTConfig{Vocab: 300, Context: 16, Width: 64, Layers: 2, Heads: 4}, 8, nil)
	dir := t.TempDir()
	for _, m := range []Model{l, g} {
		c, _ := ConfigOf(m)
		path := filepath.Join(dir, c.Arch.String())
		if err := Save(ctx, m, path, false, nil); err != nil {
			t.Fatal(err)
		}
		w, err := OpenChecked(ctx, path, nil, func(got modelspec.Config) error { return modelspec.Compare(got, c) })
		if err != nil {
			t.Fatal(err)
		}
		if sum, err := w.Hash(ctx); err != nil || sum != m.Hash() {
			t.Fatalf("%s: hash %x, %v; the model's %x", c.Arch, sum[:4], err, m.Hash())
		}
		if w.Host != nil {
			t.Errorf("%s: the weights are a host model's", c.Arch)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		refuse := errors.New("not this run's model")
		if _, err := OpenChecked(ctx, path, nil, func(modelspec.Config) error { return refuse }); !errors.Is(err, refuse) {
			t.Errorf("%s: a config the run refuses: %v", c.Arch, err)
		}
	}

	// GPT files that are not the model's.
	ts := g.CheckpointTensors()
	meta := map[string]string{}
	mc, _ := ConfigOf(g)
	save := func(name string, ts []checkpoint.Tensor, meta map[string]string) string {
		path := filepath.Join(dir, name)
		if err := checkpoint.Save(ctx, path, ts, meta); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if _, err := OpenChecked(ctx, save("bare.safetensors", ts, nil), nil, nil); !errors.Is(err, checkpoint.ErrNoModelConfig) {
		t.Errorf("a file without the model's metadata: %v, want ErrNoModelConfig", err)
	}
	good := filepath.Join(dir, mc.Arch.String())
	withMeta, err := checkpoint.Load(good)
	if err != nil {
		t.Fatal(err)
	}
	meta = withMeta.Metadata()
	extra := append(slices.Clone(ts), checkpoint.Tensor{Name: "extra", Shape: []int{1}, Data: []float32{1}})
	if _, err := OpenChecked(ctx, save("extra.safetensors", extra, meta), nil, nil); err == nil || !strings.Contains(err.Error(), `"extra"`) {
		t.Errorf("a file with a tensor too many: %v", err)
	}
	nan := slices.Clone(ts)
	nan[0].Data = slices.Clone(nan[0].Data)
	nan[0].Data[3] = float32(math.Inf(1))
	w, err := OpenChecked(ctx, save("nan.safetensors", nan, meta), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Hash(ctx); err == nil || !strings.Contains(err.Error(), "+Inf at 3") {
		t.Errorf("a file holding +Inf read as %v", err)
	}
}
