package torch

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/memwatch"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
)

// BenchmarkSaveFromEngine: a checkpoint of a torch engine's model (a Llama
// of 25M parameters) saved as the node saves it, read from the worker a
// range at a time (weights), and as it was saved before Engine.Weights, the
// model copied out whole first (copy). Each reports the Go heap's peak
// above where it started (peak-heap-MiB) beside the model's bytes
// (model-MiB), so the two paths' memory is compared in one run.
func BenchmarkSaveFromEngine(b *testing.B) {
	op, m := benchLlama(b)
	modelMiB := float64(4*m.NumParams()) / (1 << 20)
	e, err := op.Open(context.Background(), hostSpec(b, m, runOptions(true), 0))
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	m = nil // the engine holds the model now; the heap starts without it
	ctx := context.Background()
	for _, path := range []struct {
		name string
		save func(dir string) error
	}{
		{"weights", func(dir string) error {
			w, err := e.Weights()
			if err != nil {
				return err
			}
			return runmodel.SaveWeights(ctx, w, dir, false, nil)
		}},
		{"copy", func(dir string) error {
			m, err := e.(*eng).Model(ctx)
			if err != nil {
				return err
			}
			return runmodel.Save(ctx, m, dir, false, nil)
		}},
	} {
		b.Run(path.name, func(b *testing.B) {
			var peak float64
			for b.Loop() {
				dir := filepath.Join(b.TempDir(), "ck")
				p, err := memwatch.HeapPeak(func() error { return path.save(dir) })
				if err != nil {
					b.Fatal(err)
				}
				peak = max(peak, p)
			}
			b.ReportMetric(peak/(1<<20), "peak-heap-MiB")
			b.ReportMetric(modelMiB, "model-MiB")
		})
	}
}

// BenchmarkOpenEngine: a torch engine opened on a Llama of 25M parameters
// (99.5 MiB in fp32) drawn from a seed, as the node opens a seed:N model
// now (seed: the weights drawn as the open request reads them) and as it
// did before (host: the model built on the host first, then read into the
// request). Each reports the Go heap's peak above where it started
// (peak-heap-MiB) beside the model's bytes (model-MiB).
func BenchmarkOpenEngine(b *testing.B) {
	op, m := benchLlama(b)
	cfg, err := runmodel.ConfigOf(m)
	if err != nil {
		b.Fatal(err)
	}
	modelMiB := float64(4*m.NumParams()) / (1 << 20)
	m = nil
	for _, path := range []struct {
		name    string
		weights func() (weights.Weights, error)
	}{
		{"seed", func() (weights.Weights, error) { return runmodel.Seeded(cfg, 1) }},
		{"host", func() (weights.Weights, error) {
			m, err := runmodel.New(cfg, 1, nil)
			if err != nil {
				return weights.Weights{}, err
			}
			return runmodel.HostWeights(m)
		}},
	} {
		b.Run(path.name, func(b *testing.B) {
			var peak float64
			for b.Loop() {
				p, err := memwatch.HeapPeak(func() error {
					w, err := path.weights()
					if err != nil {
						return err
					}
					e, err := op.Open(context.Background(), engine.Spec{Weights: w, Optimizer: runOptions(true)})
					if err != nil {
						return err
					}
					return e.Close()
				})
				if err != nil {
					b.Fatal(err)
				}
				peak = max(peak, p)
			}
			b.ReportMetric(peak/(1<<20), "peak-heap-MiB")
			b.ReportMetric(modelMiB, "model-MiB")
		})
	}
}

// benchLlama is the model the weights benchmarks move (a Llama of 25M
// parameters, 99.5 MiB in fp32) and an opener for it.
func benchLlama(b *testing.B) (*Opener, runmodel.Model) {
	b.Helper()
	op, err := New()
	if err != nil {
		b.Fatal(err)
	}
	m, err := runmodel.New(modelspec.Config{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 8192, Context: 128,
		Width: 512, Layers: 6, Heads: 8, KVHeads: 4, Intermediate: 1408, RopeTheta: 10000}}, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	return op, m
}
