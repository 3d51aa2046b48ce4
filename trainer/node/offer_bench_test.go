package node

import (
	"context"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/internal/memwatch"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
)

// BenchmarkOfferFromEngine: a torch engine's model (a Llama of 50M
// parameters) made into the P2P checkpoint a node offers joiners: as the
// node offers it (file: a snapshot written to an unlinked file a chunk at a
// time, then read once for its block digests, which is what the network
// does before it serves it from the file) and as it was offered before
// (copy: every tensor read into memory, where the network kept it). Each
// reports the Go heap's peak above where it started (peak-heap-MiB) beside
// the model's bytes (model-MiB), so the two paths' memory is compared in
// one run.
func BenchmarkOfferFromEngine(b *testing.B) {
	op, err := torch.New()
	if err != nil {
		b.Fatal(err)
	}
	cfg := modelspec.Config{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 16384, Context: 128, Width: 640,
		Layers: 6, Heads: 10, KVHeads: 5, Intermediate: 1728, RopeTheta: 10000}}
	m, err := runmodel.New(cfg, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	modelMiB := float64(4*m.NumParams()) / (1 << 20)
	hw, err := runmodel.HostWeights(m)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	e, err := op.Open(ctx, engine.Spec{Weights: hw, Optimizer: distro.Options{Chunk: 16, TopK: 8, Decay: 0.999, Workers: 2}})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	m, hw = nil, weights.Weights{} // the engine holds the model now; the heap starts without it
	w, err := e.Weights()
	if err != nil {
		b.Fatal(err)
	}
	for _, path := range []struct {
		name  string
		offer func() error
	}{
		{"file", func() error {
			src, err := writeOffer(ctx, w, nil)
			if err != nil {
				return err
			}
			defer src.Close()
			_, _, err = p2p.Manifest(ctx, src)
			return err
		}},
		{"copy", func() error {
			src, err := writeOffer(ctx, w, nil)
			if err != nil {
				return err
			}
			ts, err := p2p.ReadTensors(src)
			src.Close()
			if err != nil {
				return err
			}
			_, _, err = p2p.Manifest(ctx, p2p.TensorsSource(ts))
			return err
		}},
	} {
		b.Run(path.name, func(b *testing.B) {
			var peak float64
			for b.Loop() {
				p, err := memwatch.HeapPeak(path.offer)
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
