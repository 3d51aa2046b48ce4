package node

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"log/slog"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// liveHeap collects and returns the bytes of heap objects that survived:
// what the process holds at that point, whatever the collector did before.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A torch engine's model crosses the Go process only a chunk at a time: a
// seeded model is drawn into the engine as it is read, and the node offers
// it to joiners over libp2p, saves it and hashes it, while the Go heap holds
// less than a quarter of the model's bytes above where it started,
// measured after every read of the weights and after each step
// (a collection first, so the figure is what is held, not what awaits
// collection). A model copied out whole, or kept by the network, would be
// held at those points.
func TestTorchModelLeavesTheEngineInChunks(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the torch engine")
	}
	op, err := torch.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg := modelspec.Config{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 8192, Context: 64, Width: 512, Layers: 4,
		Heads: 8, KVHeads: 4, Intermediate: 1408, RopeTheta: 10000}}
	seeded, err := runmodel.Seeded(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	modelBytes := uint64(4 * cfg.NumParams())
	ctx := context.Background()
	seed := sha256.Sum256([]byte("nocopy"))
	net, err := libp2p.New(libp2p.WithListenAddrs("/ip4/127.0.0.1/tcp/0"), libp2p.WithRunID("nocopy"),
		libp2p.WithKey(ed25519.NewKeyFromSeed(seed[:])))
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	base := liveHeap()
	var peak uint64
	sample := func() {
		if l := liveHeap(); l > base {
			peak = max(peak, l-base)
		}
	}
	sampled := func(w runmodel.Weights) runmodel.Weights {
		read := w.Read
		w.Read = func(ctx context.Context, i, off int, dst []float32) error {
			err := read(ctx, i, off, dst)
			sample()
			return err
		}
		return w
	}
	e, err := op.Open(ctx, engine.Spec{Weights: sampled(seeded), Optimizer: distro.Options{Chunk: 16, TopK: 8, Decay: 0.999, Workers: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	sample()
	n := &Node{cfg: config{log: slog.New(slog.DiscardHandler)}, net: net}
	n.setEngine(e, nil)
	dir := t.TempDir()

	var rev string
	id, err := func() (coordinator.Hash, error) {
		w, err := n.weights(e)
		if err != nil {
			return coordinator.Hash{}, err
		}
		w = sampled(w)
		id, err := n.offerWeights(ctx, 1, w)
		sample()
		if err != nil {
			return id, err
		}
		if err := w.Save(ctx, filepath.Join(dir, "model.safetensors"), false, nil); err != nil {
			return id, err
		}
		sample()
		rev, err = w.Revision(ctx)
		return id, err
	}()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("open, offer %x, save and hash of a %.1f MiB model held at most %.2f MiB of Go heap", id[:4], float64(modelBytes)/(1<<20), float64(peak)/(1<<20))
	if peak > modelBytes/4 {
		t.Fatalf("the Go heap held %d bytes above its start for a %d-byte model: a copy of the model (or of a large tensor) was kept", peak, modelBytes)
	}
	// What went through in chunks is the model the seed draws.
	if want, err := runmodel.New(cfg, 1, nil); err != nil || rev != runmodel.Revision(want) {
		t.Fatalf("the engine's model hashes to %s, the seed's to another (%v)", rev, err)
	}
}
