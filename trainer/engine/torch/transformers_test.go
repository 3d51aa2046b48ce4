package torch

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// exampleConfigs are the shipped transformers configs, one per family.
var exampleConfigs = []string{"../../../examples/hf/qwen3-tiny.json", "../../../examples/hf/gemma3-tiny.json"}

func transformersModel(t *testing.T, path string, seed uint64) *runmodel.Transformers {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := runmodel.NewTransformers(data, 32, seed)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func openModel(t *testing.T, op *Opener, m runmodel.Model) engine.Engine {
	t.Helper()
	e, err := op.Open(context.Background(), hostSpec(t, m, runOptions(true), 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestTransformersSeededInit: engines opened on one config and seed draw
// the same weights (every trainer starts from the same model) and compute
// the same losses; another seed draws others. The weights come out as the
// model's state-dict names, and an engine opened on them holds them
// exactly (how a model moves between trainers and checkpoints).
func TestTransformersSeededInit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts torch workers")
	}
	_, op := openers(t)
	ctx := context.Background()
	for _, path := range exampleConfigs {
		t.Run(filepath.Base(path), func(t *testing.T) {
			var hashes []string
			var losses [][]float32
			b := randomBatch(rand.New(rand.NewPCG(1, 2)), 256, 3, 32)
			var drawn runmodel.Model
			for _, seed := range []uint64{7, 7, 8} {
				e := openModel(t, op, transformersModel(t, path, seed))
				m, err := hostModel(ctx, e)
				if err != nil {
					t.Fatal(err)
				}
				l, err := e.Losses(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				hashes, losses, drawn = append(hashes, runmodel.Revision(m)), append(losses, l.Seqs), m
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if hashes[0] != hashes[1] || !slices.Equal(losses[0], losses[1]) {
				t.Fatalf("seed 7 twice: hashes %s, %s; losses %v, %v", hashes[0], hashes[1], losses[0], losses[1])
			}
			if hashes[2] == hashes[0] {
				t.Fatalf("seeds 7 and 8 drew the same weights (%s)", hashes[0])
			}
			tf := drawn.(*runmodel.Transformers)
			if names := tf.Names(); len(names) == 0 || names[0] != "model.embed_tokens.weight" || slices.Contains(names, "lm_head.weight") {
				t.Fatalf("names %v: want the state dict's, the tied head once (as the embedding)", names)
			}
			reopened := openModel(t, op, drawn)
			weightsMatchModel(t, reopened)
			again, err := hostModel(ctx, reopened)
			if err != nil || runmodel.Revision(again) != hashes[2] {
				t.Fatalf("reopened on its tensors: %v, hash %s, want %s", err, runmodel.Revision(again), hashes[2])
			}
			dir := t.TempDir()
			if err := runmodel.Save(ctx, drawn, dir, true, nil); err != nil {
				t.Fatal(err)
			}
			ck, err := checkpoint.Load(filepath.Join(dir, "model.safetensors"))
			if err != nil || !slices.Equal(slices.Sorted(slices.Values(ck.Names())), slices.Sorted(slices.Values(tf.Names()))) {
				t.Fatalf("saved: %v, names %v", err, ck.Names())
			}
			if cfg, err := os.ReadFile(filepath.Join(dir, "config.json")); err != nil || string(cfg) != string(tf.JSON) {
				t.Fatalf("saved config.json: %v", err)
			}
		})
	}
}

// runWithConfig is a Transformers run's model naming the config at path.
func runWithConfig(t *testing.T, path string) *coordinator.Model {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := &coordinator.Model{MaxSeqLen: 32}
	f, err := modelspec.ParseTransformersFile(data)
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.Mirror(32)
	if err != nil {
		t.Fatal(err)
	}
	modelspec.SetTransformers(m, c)
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], modelspec.SeedConfigURL(1, path))
	_ = coordinator.SetFixedString(m.Checkpoint.Source.Revision[:], modelspec.ConfigHash(data))
	return m
}

// TestTransformersCheckModel: what a torch trainer says before joining a
// transformers run it cannot train, each in one line: an unknown
// model_type, transformers missing from its python, a config edited after
// the run recorded its hash. A shipped config passes.
func TestTransformersCheckModel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts torch workers")
	}
	_, op := openers(t)
	ctx := context.Background()
	if err := op.CheckModel(ctx, runWithConfig(t, exampleConfigs[0])); err != nil {
		t.Fatalf("the qwen3 example: %v", err)
	}
	dir := t.TempDir()
	unknown := filepath.Join(dir, "unknown.json")
	data, _ := os.ReadFile(exampleConfigs[0])
	if err := os.WriteFile(unknown, []byte(strings.Replace(string(data), `"qwen3"`, `"nosuch-lm"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	oneLine := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line with %q", what, err, want)
		}
	}
	oneLine("unknown model_type", op.CheckModel(ctx, runWithConfig(t, unknown)), `model_type 'nosuch-lm' is unknown to transformers`)

	edited := runWithConfig(t, unknown)
	if err := os.WriteFile(unknown, data, 0o644); err != nil {
		t.Fatal(err)
	}
	oneLine("edited config", op.CheckModel(ctx, edited), "hashes to "+modelspec.ConfigHash(data)+", the run records ")

	// A python that has torch and numpy but no transformers: the same
	// interpreter with a transformers package first on its path that
	// fails to import, as a missing one does.
	shadow := filepath.Join(dir, "shadow", "transformers")
	if err := os.MkdirAll(shadow, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shadow, "__init__.py"), []byte("raise ImportError(\"No module named 'transformers'\")\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(dir, "python")
	script := "#!/bin/sh\nPYTHONPATH=" + filepath.Dir(shadow) + " exec " + torchPython(t) + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	bare, err := New(WithPython(wrapper))
	if err != nil {
		t.Fatal(err)
	}
	oneLine("no transformers", bare.CheckModel(ctx, runWithConfig(t, exampleConfigs[0])), "transformers is not installed in ")
}

// TestFits: a model whose training state exceeds the device's memory is
// refused in one line naming both; a device that does not count takes any.
func TestFits(t *testing.T) {
	if err := fits(1000, 20_000, "cuda:0", false); err != nil {
		t.Fatal(err)
	}
	if err := fits(1<<30, 0, "cpu", false); err != nil {
		t.Fatal(err)
	}
	err := fits(1<<30, 8<<30, "cuda:0", false)
	if err == nil || !strings.Contains(err.Error(), "need at least 20.0 GiB to train on cuda:0, which has 8.0 GiB") {
		t.Fatalf("fits(2^30 params, 8 GiB) = %v", err)
	}
	err = fits(1<<20, 1<<20, "cpu", true)
	if err == nil || !strings.Contains(err.Error(), "need at least 20.0 MiB to train on cpu, where this trainer may use 1.0 MiB") {
		t.Fatalf("fits(2^20 params, a bound of 1 MiB) = %v", err)
	}
}
