package node

import (
	"context"
	"crypto/ed25519"
	"log/slog"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p/memnet"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/node/machine"
)

// TestKeptModelFollowsTheRule: the node holds the run's plan beside its
// engine. A model kept from one epoch to the next keeps its engine and its
// plan while the run's options stay; when the run changed its aggregation
// rule while paused, the node combines with a new plan of the new rule (the
// old one, which a round in flight may still read, never changes).
func TestKeptModelFollowsTheRule(t *testing.T) {
	ctx := context.Background()
	s := &coordinator.Coordinator{}
	s.Model = coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
		Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64}}
	modelspec.SetGPT(&s.Model, gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2})
	s.Model.Checkpoint.Kind = coordinator.CheckpointHub
	_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.URL[:], "seed:1")
	_ = coordinator.SetFixedString(s.Model.DataLocation[:], "builtin:opticks")
	net := memnet.NewHub().Join("run", ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)), coordinator.Pubkey{1})
	n := &Node{cfg: config{log: slog.New(slog.DiscardHandler), workers: 1}, net: net}
	if err := loadRecorded(ctx, n, s); err != nil {
		t.Fatal(err)
	}
	e, robust := n.held()
	if robust == nil || robust.Options().Aggregation != distro.AggregateRobust {
		t.Fatalf("after the load the node holds plan %v", robust)
	}
	if want := e.Shapes(); len(robust.Shapes()) != len(want) || robust.MaxFrameBytes() == 0 {
		t.Fatalf("the plan cuts %d tensors, the engine holds %d", len(robust.Shapes()), len(want))
	}
	keep := func() {
		t.Helper()
		s.Progress.Epoch++
		if err := n.load(ctx, &machine.LoadWork{Epoch: s.Progress.Epoch, Source: machine.LoadKeep, State: s}); err != nil {
			t.Fatal(err)
		}
		if n.engine() != e {
			t.Fatal("the kept model's engine was replaced")
		}
	}
	keep()
	if _, p := n.held(); p != robust {
		t.Error("the same options gave a new plan")
	}
	s.Model.Optimizer.Aggregation = coordinator.AggregationMean
	keep()
	_, mean := n.held()
	if mean == robust || mean.Options().Aggregation != distro.AggregateMean {
		t.Fatalf("after the rule changed the node combines under %v", mean.Options().Aggregation)
	}
	if robust.Options().Aggregation != distro.AggregateRobust {
		t.Error("the old plan changed")
	}
}
