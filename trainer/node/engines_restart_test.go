package node

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/p2p/memnet"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// TestEnginesDisagreeAtRestart: in a run that mixes engines, the previous
// epoch's holders may hold models that differ in their last bits (two
// engines on different devices round an apply differently). Their P2P
// offers then name different manifests, no majority forms, and a joiner
// (here one on the torch engine) does not wait for one for ever: after its
// checkpoint wait it loads the run's recorded checkpoint, which it checks
// against the recorded hash (the checkpoint is the file its checkpointer
// saved, so the hash holds whatever engine saved it).
func TestEnginesDisagreeAtRestart(t *testing.T) {
	ctx := context.Background()
	cfg := gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}
	recorded, _ := gpt.New(cfg, 5, nil)
	path := filepath.Join(t.TempDir(), "checkpoint.safetensors")
	if err := recorded.Save(ctx, path, nil); err != nil {
		t.Fatal(err)
	}
	// The other engine's model: one weight one ulp away.
	other, _ := gpt.New(cfg, 5, nil)
	w := other.Tensors()[2]
	w[0] = math.Nextafter32(w[0], float32(math.Inf(1)))

	hub := memnet.NewHub()
	clock := &stepClock{now: time.Unix(1_800_000_000, 0)}
	op, err := torch.New()
	if err != nil {
		t.Fatal(err)
	}
	trainer := func(name string) (*Node, coordinator.ClientID) {
		key := sha256.Sum256([]byte("p2p " + name))
		signer := coordinator.Pubkey{name[0]}
		net := hub.Join("run", ed25519.NewKeyFromSeed(key[:]), signer)
		return &Node{cfg: config{log: slog.New(slog.DiscardHandler), workers: 1, clock: clock, checkpointWait: 10 * time.Second, engine: op},
			net: net}, coordinator.ClientID{Signer: signer, P2P: net.ID()}
	}
	a, idA := trainer("A")
	b, idB := trainer("B")
	c, idC := trainer("C")
	for _, x := range []*Node{a, b} {
		if err := c.net.Connect(ctx, x.net.(*memnet.Node).Addrs()[0]); err != nil {
			t.Fatal(err)
		}
	}
	s := &coordinator.Coordinator{}
	s.Model = coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
		Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64}}
	modelspec.SetGPT(&s.Model, cfg)
	s.Model.Checkpoint.Kind = coordinator.CheckpointP2P
	_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.URL[:], "file://"+path)
	_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.Revision[:], runmodel.Revision(recorded))
	_ = coordinator.SetFixedString(s.Model.DataLocation[:], "builtin:opticks")
	s.Config.WarmupTime = 60
	s.Progress.Epoch = 3
	for i, id := range []coordinator.ClientID{idA, idB} {
		s.Epoch.Clients[i] = coordinator.Client{ID: id, State: coordinator.Healthy}
		s.Epoch.Exited[i] = coordinator.Client{ID: id, State: coordinator.Healthy}
	}
	s.Epoch.Clients[2] = coordinator.Client{ID: idC, State: coordinator.Healthy} // the joiner
	s.Epoch.ClientsLen, s.Epoch.ExitedLen = 3, 2
	if err := a.offerModel(ctx, 3, recorded); err != nil {
		t.Fatal(err)
	}
	if err := b.offerModel(ctx, 3, other); err != nil {
		t.Fatal(err)
	}

	err = loadTry(ctx, c, idC, s)
	if !retryable(err) || !errors.Is(err, p2p.ErrCheckpointDisputed) {
		t.Fatalf("the holders disagree: %v, want a disputed offer tried again later", err)
	}
	clock.now = clock.now.Add(10 * time.Second)
	if err := loadTry(ctx, c, idC, s); err != nil {
		t.Fatalf("after its checkpoint wait: %v", err)
	}
	defer c.closeEngine()
	got := c.Model()
	if !slices.Equal(paramsOf(got), paramsOf(recorded)) {
		t.Fatal("the joiner holds another model than the recorded checkpoint")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}
