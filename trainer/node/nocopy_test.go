package node

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
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
// it to joiners over libp2p, saves it and hashes it; a joiner (a second
// node and engine) fetches the offer over libp2p into a file and opens its
// own torch engine on it; a third engine opens on the saved checkpoint (a
// restart from the recorded file). All the while the Go heap holds less than half
// the model's bytes above where it started, measured after every read of
// the weights, after every block the joiner receives and after each step
// (a collection first, so the figure is what is held, not what awaits
// collection). A model copied out whole, fetched into memory or kept by
// the network would be held at those points; what is held is buffers of a
// fixed size, whatever the model's (a chunk of a read; on each checkpoint
// stream the blocks in flight and the stream's window: 19–25 MiB measured
// for one peer's two streams, at most ~60 MiB if every window fills, hence
// a model of 145 MiB).
func TestTorchModelLeavesTheEngineInChunks(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the torch engine")
	}
	op, err := torch.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg := modelspec.Config{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 8192, Context: 64, Width: 512, Layers: 10,
		Heads: 8, KVHeads: 4, Intermediate: 1408, RopeTheta: 10000}}
	seeded, err := runmodel.Seeded(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	modelBytes := uint64(4 * cfg.NumParams())
	ctx := context.Background()
	var (
		base, peak uint64
		mu         sync.Mutex
	)
	sample := func() {
		mu.Lock()
		defer mu.Unlock()
		if l := liveHeap(); l > base {
			peak = max(peak, l-base)
		}
	}
	var ids []coordinator.ClientID
	node := func(name string, opts ...libp2p.Option) *libp2p.Node {
		seed := sha256.Sum256([]byte(name))
		key := ed25519.NewKeyFromSeed(seed[:])
		net, err := libp2p.New(append(opts, libp2p.WithListenAddrs("/ip4/127.0.0.1/tcp/0"), libp2p.WithRunID("nocopy"),
			libp2p.WithKey(key))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { net.Close() })
		var id coordinator.ClientID
		id.Signer = coordinator.Pubkey(sha256.Sum256([]byte("signer " + name)))
		copy(id.P2P[:], key.Public().(ed25519.PublicKey))
		ids = append(ids, id)
		return net
	}
	net := node("nocopy")
	joinNet := node("nocopy joiner", libp2p.WithCheckpointProgress(func(int, int) { sample() }))
	for _, n := range []*libp2p.Node{net, joinNet} {
		n.SetClients(ids)
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		go n.Run(rctx)
	}
	if err := joinNet.Connect(ctx, net.Addrs()[0]); err != nil {
		t.Fatal(err)
	}
	base = liveHeap()
	sampled := func(w weights.Weights) weights.Weights {
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
		if err := runmodel.SaveWeights(ctx, w, filepath.Join(dir, "model.safetensors"), false, nil); err != nil {
			return id, err
		}
		sample()
		rev, err = w.Revision(ctx)
		return id, err
	}()
	if err != nil {
		t.Fatal(err)
	}

	// reopen opens another torch engine on w, each read sampled, runs then
	// (if set) while it is open, and says which model the engine holds.
	joiner := &Node{cfg: config{log: slog.New(slog.DiscardHandler)}, net: joinNet}
	reopen := func(w weights.Weights, then func() error) (string, error) {
		e, err := op.Open(ctx, engine.Spec{Weights: sampled(w), Optimizer: distro.Options{Chunk: 16, TopK: 8, Decay: 0.999, Workers: 1}})
		if err != nil {
			return "", err
		}
		defer e.Close()
		sample()
		if then != nil {
			if err := then(); err != nil {
				return "", err
			}
			sample()
		}
		held, err := joiner.weights(e)
		if err != nil {
			return "", err
		}
		return sampled(held).Revision(ctx)
	}

	// The joiner: fetched into a file, checked, opened on, served on.
	joinRev, err := func() (string, error) {
		w, f, err := joiner.fetchWeights(ctx, nil, cfg, id, []coordinator.Pubkey{net.ID()})
		sample()
		if err != nil {
			return "", err
		}
		served := false
		defer func() {
			if !served {
				f.Close()
			}
		}()
		if err := checkValues(ctx, sampled(w)); err != nil {
			return "", err
		}
		return reopen(w, func() error {
			again, err := joinNet.ShareCheckpoint(ctx, 1, f)
			served = true
			if err != nil || again != id {
				return fmt.Errorf("the joiner serves %x (%v), the sharer %x", again[:4], err, id[:4])
			}
			return nil
		})
	}()
	if err != nil {
		t.Fatal(err)
	}
	if joinRev != rev {
		t.Fatalf("the joiner's engine holds model %s, the sharer's %s", joinRev, rev)
	}

	// A restart from the saved checkpoint: the node's load of a file://
	// URL (a Llama directory) read into a third engine as it is asked for.
	w, err := joiner.loadURL(ctx, "file://"+filepath.Join(dir, "model.safetensors"), cfg, coordinator.CheckpointStore{})
	sample()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Host != nil {
		t.Fatal("the file's model was built on the host")
	}
	fileRev, err := reopen(w, nil)
	if err != nil {
		t.Fatal(err)
	}
	if fileRev != rev {
		t.Fatalf("the engine opened on the saved file holds model %s, the sharer's %s", fileRev, rev)
	}
	t.Logf("open, offer %x, save and hash of a %.1f MiB model, a joiner's fetch and open on it, and an open on the saved file, held at most %.2f MiB of Go heap", id[:4], float64(modelBytes)/(1<<20), float64(peak)/(1<<20))
	if peak > modelBytes/2 {
		t.Fatalf("the Go heap held %d bytes above its start for a %d-byte model: a copy of the model (or of a large tensor) was kept", peak, modelBytes)
	}
	// What went through in chunks is the model the seed draws.
	if want, err := runmodel.New(cfg, 1, nil); err != nil || rev != runmodel.Revision(want) {
		t.Fatalf("the engine's model hashes to %s, the seed's to another (%v)", rev, err)
	}
}
