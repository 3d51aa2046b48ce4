package runmodel

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

const qwenJSON = `{"model_type":"qwen3","vocab_size":256,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"max_position_embeddings":128}`

// TestLoadTransformersConfig: a trainer reads the run's config.json and
// refuses one whose hash is not the run's revision or whose shape is not
// the account's, each naming what differs.
func TestLoadTransformersConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(qwenJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(edit func(*coordinator.Model)) *coordinator.Model {
		m := &coordinator.Model{}
		modelspec.SetTransformers(m, modelspec.TransformersConfig{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4})
		_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], modelspec.SeedConfigURL(5, path))
		_ = coordinator.SetFixedString(m.Checkpoint.Source.Revision[:], modelspec.ConfigHash([]byte(qwenJSON)))
		if edit != nil {
			edit(m)
		}
		return m
	}
	tf, err := LoadRunTransformers(run(nil))
	if err != nil || tf.Seed != 5 || tf.Drawn() || tf.File.ModelType != "qwen3" || string(tf.JSON) != qwenJSON {
		t.Fatalf("LoadRunTransformers = %+v, %v", tf, err)
	}
	for _, tt := range []struct {
		name string
		edit func(*coordinator.Model)
		want string
	}{
		{"edited", func(m *coordinator.Model) {
			_ = coordinator.SetFixedString(m.Checkpoint.Source.Revision[:], strings.Repeat("0", 32))
		}, "hashes to"},
		{"shape", func(m *coordinator.Model) { m.NLayers = 3 }, "n_layers is 2 in the model, 3 in the run"},
		{"positions", func(m *coordinator.Model) { m.MaxSeqLen = 129 }, "exceeds the config's 128 positions"},
		{"source", func(m *coordinator.Model) { _ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "seed:5") }, "starts from seed:N@PATH"},
	} {
		if _, err := LoadRunTransformers(run(tt.edit)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestTransformersHostModel: the host side holds named tensors and never
// computes.
func TestTransformersHostModel(t *testing.T) {
	tf, err := NewTransformers([]byte(qwenJSON), 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tf.Forward(nil, nil, 1, 1); !errors.Is(err, ErrComputesElsewhere) {
		t.Fatalf("Forward = %v", err)
	}
	if err := tf.Save(t.Context(), t.TempDir(), nil); err == nil {
		t.Fatal("saved a model with no weights")
	}
	if _, err := tf.WithTensors([]string{"a"}, [][]int{{2, 2}}, [][]float32{{1, 2, 3}}); err == nil {
		t.Fatal("took a tensor of 3 values for shape [2 2]")
	}
	held, err := tf.WithTensors([]string{"a", "b"}, [][]int{{2, 2}, {1}}, [][]float32{{1, 2, 3, 4}, {5}})
	if err != nil || !held.Drawn() || tf.Drawn() || held.NumParams() != 5 {
		t.Fatalf("WithTensors: %v, drawn %v (original %v), %d params", err, held.Drawn(), tf.Drawn(), held.NumParams())
	}
	if c, err := ConfigOf(held); err != nil || c.Arch != coordinator.ArchTransformers || c.Transformers != tf.Config {
		t.Fatalf("ConfigOf = %+v, %v", c, err)
	}
}

// savedTwoTensors is a transformers model of two tensors, held out of
// transformers' order, and the directory it was saved as.
func savedTwoTensors(t *testing.T) (held *Transformers, dir string) {
	t.Helper()
	tf, err := NewTransformers([]byte(qwenJSON), 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	held, err = tf.WithTensors([]string{"z.weight", "a.weight"}, [][]int{{2, 2}, {3}}, [][]float32{{1, 2, 3, 4}, {5, 6, 7}})
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if err := held.Save(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	return held, dir
}

// TestTransformersDirectoryRoundTrip: a saved transformers model, named as
// the run's source (file://dir, its hash the revision), loads with the same
// hash, whatever order its tensors were held in, and InOrder puts them back
// in transformers' order.
func TestTransformersDirectoryRoundTrip(t *testing.T) {
	held, dir := savedTwoTensors(t)
	names, shapes := held.Names(), held.Shapes()
	m := &coordinator.Model{}
	modelspec.SetTransformers(m, held.Config)
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "file://"+dir)
	_ = coordinator.SetFixedString(m.Checkpoint.Source.Revision[:], Revision(held))
	loaded, err := LoadRunTransformers(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckRevision(loaded, "file://"+dir, Revision(held)); err != nil {
		t.Fatal(err)
	}
	if got := loaded.Names(); got[0] != "a.weight" {
		t.Fatalf("loaded in file order %v", got)
	}
	// The engine reads them in transformers' order (Weights.InOrder).
	w, err := HostWeights(loaded)
	if err != nil {
		t.Fatal(err)
	}
	back, err := w.InOrder(names, shapes)
	if err != nil || back.Names[0] != "z.weight" {
		t.Fatalf("InOrder: %v, %v", err, back.Names)
	}
	got := make([]float32, modelspec.Size(shapes[0]))
	if err := back.Read(t.Context(), 0, 0, got); err != nil || got[3] != 4 {
		t.Fatalf("z.weight read as %v, %v", got, err)
	}
	if rev, err := back.Revision(t.Context()); err != nil || rev != Revision(held) {
		t.Fatalf("the reordered weights hash to %s, %v; the model %s", rev, err, Revision(held))
	}
	if _, err := w.InOrder([]string{"z.weight", "b.weight"}, shapes); err == nil {
		t.Fatal("InOrder took a tensor the model lacks")
	}
}

// TestCheckTransformersDir: a directory's tensors are checked from its
// weights file's header; a directory of shards or without weights is
// refused saying what psyche reads.
func TestCheckTransformersDir(t *testing.T) {
	held, dir := savedTwoTensors(t)
	names, shapes := held.Names(), held.Shapes()
	if err := CheckTransformersDir(dir, names, shapes); err != nil {
		t.Fatal(err)
	}
	if err := CheckTransformersDir(dir, names, [][]int{{2, 2}, {4}}); err == nil || !strings.Contains(err.Error(), "tensor a.weight is [3] in the checkpoint") {
		t.Fatalf("a misshapen tensor: %v", err)
	}
	if err := os.Rename(filepath.Join(dir, "model.safetensors"), filepath.Join(dir, "model-00001-of-00001.safetensors")); err != nil {
		t.Fatal(err)
	}
	// Still a missing file to a node, which then waits for a trainer that
	// holds the directory to offer it.
	if err := CheckTransformersDir(dir, names, shapes); err == nil || !strings.Contains(err.Error(), "has no model.safetensors") ||
		!errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no weights: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckTransformersDir(dir, names, shapes); err == nil || !strings.Contains(err.Error(), "holds its weights in shards") {
		t.Fatalf("shards: %v", err)
	}
}

// TestTransformersHashCoversConfig: the same tensors under two configs are
// two models (two revisions): the config decides what the weights compute.
func TestTransformersHashCoversConfig(t *testing.T) {
	names, shapes, values := []string{"a.weight"}, [][]int{{2}}, [][]float32{{1, 2}}
	var revs []string
	for _, cfg := range []string{qwenJSON, strings.Replace(qwenJSON, `"max_position_embeddings":128`, `"max_position_embeddings":128,"rms_norm_eps":1e-5`, 1)} {
		tf, err := NewTransformers([]byte(cfg), 64, 1)
		if err != nil {
			t.Fatal(err)
		}
		if tf, err = tf.WithTensors(names, shapes, values); err != nil {
			t.Fatal(err)
		}
		revs = append(revs, Revision(tf))
	}
	if revs[0] == revs[1] {
		t.Fatalf("two configs, one revision %s", revs[0])
	}
}
