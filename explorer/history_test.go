package explorer

import (
	"crypto/ed25519"
	"math"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

func pub(b byte) coordinator.Pubkey {
	var k coordinator.Pubkey
	k[0] = b
	return k
}

// trainingRun is a run in RoundWitness of step 7 (epoch 1, which started at
// step 5: height 2), with three members, one of them dropped, one joiner
// and one client that exited healthy; the current round has two witnesses.
func trainingRun() *coordinator.Coordinator {
	s := &coordinator.Coordinator{Nonce: 10, RunState: coordinator.RoundWitness, RunStateStart: 1000}
	_ = coordinator.SetFixedString(s.Metadata.Name[:], "demo")
	s.Config = coordinator.Config{WarmupTime: 5, CooldownTime: 5, MaxRoundTrainTime: 30, RoundWitnessTime: 2, EpochTime: 60,
		WaitingForMembersExtraTime: 1, TotalSteps: 100, GlobalBatchSizeStart: 12, GlobalBatchSizeEnd: 12, InitMinClients: 3, MinClients: 2}
	s.Model.MaxSeqLen = 64
	s.Progress = coordinator.Progress{Epoch: 1, Step: 7}
	e := &s.Epoch
	e.StartStep, e.StartTimestamp, e.ClientsLen = 5, 990, 3
	for i := range 3 {
		e.Clients[i] = coordinator.Client{ID: coordinator.ClientID{Signer: pub(byte(1 + i)), P2P: pub(byte(101 + i))}}
	}
	e.Clients[2].State = coordinator.Dropped
	e.Exited[0] = coordinator.Client{ID: coordinator.ClientID{Signer: pub(9), P2P: pub(109)}}
	e.ExitedLen = 1
	s.Pending[0] = coordinator.ClientID{Signer: pub(7), P2P: pub(107)}
	s.PendingLen = 1
	e.CurrentRound = 2
	for h := range uint32(3) {
		e.Rounds[h] = coordinator.Round{Height: h, ClientsLen: 3, RandomSeed: 42 + uint64(h), DataIndex: 12 * uint64(h)}
	}
	r := &e.Rounds[2]
	r.Witnesses[0] = coordinator.Witness{Proof: coordinator.WitnessProof{Index: 0},
		Metadata: coordinator.WitnessMetadata{Step: 7, Loss: 4, TokensPerSec: 256, BandwidthPerSec: 100}}
	r.Witnesses[1] = coordinator.Witness{Proof: coordinator.WitnessProof{Index: 1},
		Metadata: coordinator.WitnessMetadata{Step: 7, Loss: 5, TokensPerSec: 512, BandwidthPerSec: 400}}
	r.WitnessesLen = 2
	s.Model.Checkpoint.Kind = coordinator.CheckpointHub
	_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.URL[:], "seed:1")
	return s
}

func TestHistoryFoldsWitnessReports(t *testing.T) {
	h := newHistory("demo")
	s := trainingRun()
	if !h.observe(s) {
		t.Fatal("the first snapshot changed nothing")
	}
	if len(h.points) != 1 {
		t.Fatalf("points %+v, want one (only the current round has witnesses)", h.points)
	}
	p := h.points[0]
	if p.Step != 7 || p.Epoch != 1 || p.Witnesses != 2 || p.Quorum != 2 || p.Trainers != 3 {
		t.Errorf("point %+v", p)
	}
	if p.Loss == nil || *p.Loss != 4.5 {
		t.Errorf("loss %v, want the witnesses' mean 4.5", p.Loss)
	}
	// Each trainer has 4 sequences of 64 tokens: witness 0 took 1 s and
	// sent 100 B, witness 1 took 0.5 s and sent 200 B. Scaled to the three
	// trainers: (256+512)/2*3 tokens/s and (100+200)/2*3 bytes.
	if p.TokensPerSec == nil || *p.TokensPerSec != 1152 {
		t.Errorf("tokens/s %v, want 1152", p.TokensPerSec)
	}
	if p.BytesSent == nil || math.Abs(*p.BytesSent-450) > 1e-9 {
		t.Errorf("bytes %v, want 450", p.BytesSent)
	}
	v := h.view
	if v.State != "RoundWitness" || v.StateDeadline != 1002 || v.EpochDeadline != 1050 || v.Name != "demo" {
		t.Errorf("view %+v", v)
	}
	health := map[coordinator.Pubkey]string{pub(1): Healthy, pub(2): Healthy, pub(3): Dropped, pub(7): Pending, pub(9): Left}
	if len(v.Clients) != len(health) {
		t.Fatalf("clients %+v", v.Clients)
	}
	for k, want := range health {
		if c := h.clients[k]; c == nil || c.Health != want {
			t.Errorf("client %d: %+v, want %s", k[0], c, want)
		}
	}
	if v.Clients[0].Signer != pub(1).String() || v.Clients[2].Signer != pub(3).String() || v.Clients[0].P2P != PeerID(pub(101)) {
		t.Errorf("members not first in epoch order, or not their p2p ids: %+v", v.Clients)
	}
	if len(v.Rounds) != 3 || !v.Rounds[0].Current || v.Rounds[0].Step != 7 || len(v.Rounds[0].Witnesses) != 2 {
		t.Errorf("rounds %+v", v.Rounds)
	}
	if len(v.Checkpoints) != 1 || v.Checkpoints[0].URL != "seed:1" {
		t.Errorf("checkpoints %+v", v.Checkpoints)
	}

	// An older or equal snapshot changes nothing.
	old := trainingRun()
	old.Nonce = 9
	old.RunState = coordinator.Paused
	if h.observe(old) || h.view.State != "RoundWitness" {
		t.Error("an older snapshot was taken")
	}

	// The dropped client exits and the next round starts: it stays listed
	// as dropped; a third report updates step 7's point, which is sent again.
	rev := h.rev
	next := trainingRun()
	next.Nonce = 11
	e := &next.Epoch
	e.Exited[1], e.ExitedLen = e.Clients[2], 2
	e.Clients[2], e.ClientsLen = coordinator.Client{}, 2
	next.Epoch.Rounds[2].Witnesses[2] = coordinator.Witness{Proof: coordinator.WitnessProof{Index: 2},
		Metadata: coordinator.WitnessMetadata{Step: 7, Loss: 6}}
	next.Epoch.Rounds[2].WitnessesLen = 3
	if !h.observe(next) {
		t.Fatal("a newer snapshot changed nothing")
	}
	if c := h.clients[pub(3)]; c.Health != Dropped || c.Index != -1 {
		t.Errorf("exited dropped client: %+v", c)
	}
	changed := h.since(rev)
	if len(changed) != 1 || *changed[0].Loss != 5 {
		t.Errorf("changed points %+v, want step 7 with loss 5", changed)
	}

	// The run ends, the pending client goes: it has left.
	fin := trainingRun()
	fin.Nonce, fin.RunState, fin.PendingLen = 12, coordinator.Finished, 0
	h.observe(fin)
	if c := h.clients[pub(7)]; c.Health != Left {
		t.Errorf("a joiner the account forgot: %+v", c)
	}
	if h.view.StateDeadline != 0 || h.view.EpochDeadline != 0 {
		t.Errorf("a finished run has timers: %+v", h.view)
	}
}

func TestHistoryHeldOutAndCheckpoints(t *testing.T) {
	h := newHistory("demo")
	h.heldOut(0, 0, 5.5)
	s := trainingRun()
	h.observe(s)
	h.heldOut(7, 1, 4.25)
	if len(h.points) != 2 || *h.points[0].HeldOut != 5.5 || *h.points[1].HeldOut != 4.25 || *h.points[1].Loss != 4.5 {
		t.Fatalf("points %+v", h.points)
	}
	// A recorded checkpoint is a new entry; the epoch's end turning it into
	// P2P only updates it.
	rec := trainingRun()
	rec.Nonce, rec.RunState, rec.Epoch.Checkpointed = 11, coordinator.Cooldown, true
	_ = coordinator.SetFixedString(rec.Model.Checkpoint.Source.URL[:], "file:///ckpt")
	h.observe(rec)
	p2p := trainingRun()
	p2p.Nonce, p2p.RunState = 12, coordinator.WaitingForMembers
	p2p.Model.Checkpoint = rec.Model.Checkpoint
	p2p.Model.Checkpoint.Kind = coordinator.CheckpointP2P
	h.observe(p2p)
	ck := h.view.Checkpoints
	if len(ck) != 2 || !ck[1].Recorded || ck[1].Kind != "P2P" || ck[1].URL != "file:///ckpt" {
		t.Errorf("checkpoints %+v", ck)
	}
	// Witness reports kept in the ring after the epoch ended belong to it.
	if h.points[1].Epoch != 1 {
		t.Errorf("point %+v", h.points[1])
	}
}

// TestPeerIDIsLibp2ps: the page shows the ids libp2p (and the trainers'
// logs) use.
func TestPeerIDIsLibp2ps(t *testing.T) {
	for i := range 4 {
		seed := make([]byte, ed25519.SeedSize)
		seed[0] = byte(i)
		key := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
		pk, err := crypto.UnmarshalEd25519PublicKey(key)
		if err != nil {
			t.Fatal(err)
		}
		want, err := peer.IDFromPublicKey(pk)
		if err != nil {
			t.Fatal(err)
		}
		if got := PeerID(coordinator.Pubkey(key)); got != want.String() {
			t.Errorf("PeerID = %s, libp2p says %s", got, want)
		}
	}
}

// TestParametersFromTheModel: a run whose metadata leaves num_parameters
// out shows its model's count (a 120,576-parameter GPT showed 0); one that
// sets it shows that.
func TestParametersFromTheModel(t *testing.T) {
	s := trainingRun()
	cfg := gpt.Config{Vocab: 256, Context: 64, Width: 32, Layers: 2, Heads: 2}
	modelspec.SetGPT(&s.Model, cfg)
	h := newHistory("demo")
	h.observe(s)
	if got, want := h.view.Parameters, uint64(cfg.NumParams()); got != want {
		t.Errorf("parameters %d, want the model's %d", got, want)
	}
	s.Metadata.NumParameters, s.Nonce = 42, s.Nonce+1
	h.observe(s)
	if h.view.Parameters != 42 {
		t.Errorf("parameters %d, want the metadata's 42", h.view.Parameters)
	}
}

// TestViewShowsData: the page says where a run's data comes from, and
// follows a change of it.
func TestViewShowsData(t *testing.T) {
	h := newHistory("demo")
	s := trainingRun()
	for i, tc := range []struct{ loc, want string }{
		{"server:tokens/shard0.bin", "server /data/tokens/shard0.bin"},
		{"s3://tokens/train.bin", "s3://tokens/train.bin"},
		{"https://h.example/t.bin?sig=x", "https://h.example/t.bin?…"},
		{"builtin:opticks", "built-in corpus opticks"},
	} {
		_ = coordinator.SetFixedString(s.Model.DataLocation[:], tc.loc)
		s.Nonce = uint64(11 + i)
		h.observe(s)
		if h.view.Data != tc.want {
			t.Errorf("%s: the view says %q, want %q", tc.loc, h.view.Data, tc.want)
		}
	}
}
