// Package backendtest is the test suite every chain.Backend must pass: the
// same instruction flow, authority checks and subscription behaviour against
// the embedded server and against Solana.
package backendtest

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
)

// Harness is what a backend provides to the suite.
type Harness struct {
	Backend chain.Backend
	// Advance moves the backend's clock forward by seconds and ticks the run
	// (or lets it be ticked) so that time-based transitions can happen.
	Advance func(t *testing.T, seconds uint64)
}

// Key returns a deterministic key pair for a name.
func Key(name string) *chain.Keypair {
	return chain.KeypairFromSeed(sha256.Sum256([]byte("backendtest " + name)))
}

// TinyConfig and TinyModel describe a small valid run: 2 clients, short timeouts.
func TinyConfig() coordinator.Config {
	return coordinator.Config{WarmupTime: 5, CooldownTime: 5, MaxRoundTrainTime: 10, RoundWitnessTime: 2, EpochTime: 60,
		WaitingForMembersExtraTime: 1, TotalSteps: 50, GlobalBatchSizeStart: 4, GlobalBatchSizeEnd: 4,
		InitMinClients: 2, MinClients: 2}
}

// TinyModel is a valid model description for TinyConfig.
func TinyModel() coordinator.Model {
	m := coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
		MaxSeqLen: 16, VocabSize: 256, DModel: 32, NLayers: 1, NHeads: 2,
		LR:        coordinator.LRSchedule{Kind: coordinator.LRConstant, BaseLR: 1e-3},
		Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.9, CompressionTopK: 4, CompressionChunk: 16, Quantize1Bit: true}}
	m.Checkpoint.Kind = coordinator.CheckpointHub
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "file:///tmp/model")
	_ = coordinator.SetFixedString(m.DataLocation[:], "tokens.bin")
	return m
}

// CreateTinyRun creates run runID on b as admin, configured with TinyConfig
// and TinyModel, and unpauses it: the run waits for its members.
func CreateTinyRun(ctx context.Context, tb testing.TB, b chain.Backend, runID string, admin *chain.Keypair) {
	tb.Helper()
	id, err := coordinator.ParseRunID(runID)
	if err != nil {
		tb.Fatal(err)
	}
	k, m := TinyConfig(), TinyModel()
	for _, ix := range []coordinator.Instruction{&coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id},
		&coordinator.Update{Config: &k, Model: &m}, &coordinator.SetPaused{}} {
		if _, err := b.Send(ctx, runID, admin, nil, ix); err != nil {
			tb.Fatalf("creating run %s: %s: %v", runID, ix.Name(), err)
		}
	}
}

// Run drives a run through the backend: create, configure, resume, two
// joins, the start of an epoch, and the rejections on the way.
func Run(t *testing.T, runID string, h Harness) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := h.Backend
	admin, alice, bob := Key("admin"), Key("alice"), Key("bob")
	send := func(who chain.Signer, ix coordinator.Instruction) (chain.Receipt, error) {
		return b.Send(ctx, runID, who, nil, ix)
	}
	must := func(r chain.Receipt, err error) chain.Receipt {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	id, err := coordinator.ParseRunID(runID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Snapshot(ctx, runID); !errors.Is(err, chain.ErrRunNotFound) {
		t.Fatalf("snapshot of a missing run: %v", err)
	}
	must(send(admin, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id}))
	if _, err := send(admin, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id}); !errors.Is(err, coordinator.ErrAlreadyInitialized) {
		t.Fatalf("second init: %v", err)
	}
	k, m := TinyConfig(), TinyModel()
	if _, err := send(alice, &coordinator.Update{Config: &k, Model: &m}); !errors.Is(err, coordinator.ErrUnauthorized) {
		t.Fatalf("update by a non-authority: %v", err)
	}
	bad := k
	bad.MinClients = 0
	if _, err := send(admin, &coordinator.Update{Config: &bad}); !errors.Is(err, coordinator.ErrInvalidConfig) {
		t.Fatalf("invalid config: %v", err)
	}
	must(send(admin, &coordinator.Update{Config: &k, Model: &m}))
	if _, err := send(alice, &coordinator.SetPaused{Paused: false}); !errors.Is(err, coordinator.ErrUnauthorized) {
		t.Fatalf("resume by a non-authority: %v", err)
	}
	r := must(send(admin, &coordinator.SetPaused{Paused: false}))
	if r.To != coordinator.WaitingForMembers {
		t.Fatalf("resume went to %s", r.To)
	}

	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	snaps, err := b.Subscribe(subCtx, runID)
	if err != nil {
		t.Fatal(err)
	}
	first := <-snaps
	if first.State.RunState != coordinator.WaitingForMembers {
		t.Fatalf("first snapshot: %s", first.State.Describe())
	}
	for _, c := range []*chain.Keypair{alice, bob} {
		pub := c.Public()
		var p2p coordinator.Pubkey = sha256.Sum256(pub[:])
		must(send(c, &coordinator.JoinRun{ID: coordinator.ClientID{Signer: c.Public(), P2P: p2p}}))
	}
	// Snapshots arrive in nonce order until both joins show.
	last := first.Nonce()
	for {
		s := <-snaps
		if s.Nonce() <= last {
			t.Fatalf("snapshot nonce %d after %d", s.Nonce(), last)
		}
		last = s.Nonce()
		if s.State.PendingLen == 2 {
			break
		}
	}
	h.Advance(t, 2)
	deadline := time.After(30 * time.Second)
	for {
		select {
		case s := <-snaps:
			if s.State.RunState == coordinator.Warmup {
				if s.State.Epoch.ClientsLen != 2 {
					t.Fatalf("warmup with %d clients", s.State.Epoch.ClientsLen)
				}
				snap, err := b.Snapshot(ctx, runID)
				if err != nil || snap.Nonce() < s.Nonce() {
					t.Fatalf("snapshot after the subscription: %v %d < %d", err, snap.Nonce(), s.Nonce())
				}
				return
			}
		case <-deadline:
			t.Fatal("the run never reached Warmup")
		}
	}
}
