package machine

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
)

// run is a coordinator driven by hand for the machine tests: three clients,
// one of which is the machine under test.
type run struct {
	t     *testing.T
	s     *coordinator.Coordinator
	ids   []coordinator.ClientID
	admin coordinator.Pubkey
	now   uint64
}

func clientID(i int) coordinator.ClientID {
	return coordinator.ClientID{Signer: sha256.Sum256([]byte(fmt.Sprint("signer", i))), P2P: sha256.Sum256([]byte(fmt.Sprint("p2p", i)))}
}

func newRun(t *testing.T) *run {
	r := &run{t: t, admin: sha256.Sum256([]byte("admin"))}
	id, _ := coordinator.ParseRunID("m")
	s, err := coordinator.New(coordinator.InitCoordinator{MainAuthority: r.admin, RunID: id})
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	cfg := coordinator.Config{WarmupTime: 5, CooldownTime: 5, MaxRoundTrainTime: 10, RoundWitnessTime: 2, EpochTime: 100,
		WaitingForMembersExtraTime: 1, TotalSteps: 100, GlobalBatchSizeStart: 6, GlobalBatchSizeEnd: 6, InitMinClients: 3, MinClients: 2}
	m := coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2, MaxSeqLen: 8,
		VocabSize: 256, DModel: 8, NLayers: 1, NHeads: 1, LR: coordinator.LRSchedule{Kind: coordinator.LRConstant, BaseLR: 0.5},
		Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.9, CompressionTopK: 2, CompressionChunk: 8}}
	m.Checkpoint.Kind = coordinator.CheckpointHub
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "file:///m")
	_ = coordinator.SetFixedString(m.DataLocation[:], "d")
	r.apply(r.admin, &coordinator.Update{Config: &cfg, Model: &m})
	r.apply(r.admin, &coordinator.SetPaused{})
	for i := 0; i < 3; i++ {
		r.ids = append(r.ids, clientID(i))
	}
	return r
}

func (r *run) apply(sender coordinator.Pubkey, ix coordinator.Instruction) error {
	_, err := r.s.Apply(coordinator.Context{Sender: sender, Now: r.now, Seed: r.now + 7}, ix)
	return err
}

func (r *run) tick(seconds uint64) {
	for i := uint64(0); i < seconds; i++ {
		r.now++
		_, _ = r.s.Tick(r.now, r.now*31)
	}
}

// snap is a copy of the state, as a subscriber would get it.
func (r *run) snap() *coordinator.Coordinator { c := *r.s; return &c }

func keys() func() uint64 {
	k := uint64(0)
	return func() uint64 { k++; return k }
}

func TestMachineJoinsOncePerEpoch(t *testing.T) {
	r := newRun(t)
	m := New(r.ids[0], 0, false, keys())
	rd := m.Snapshot(r.snap(), 0)
	if len(rd.Send) != 1 || rd.Send[0].Name() != "join_run" {
		t.Fatalf("want a join, got %+v", rd)
	}
	if err := r.apply(r.ids[0].Signer, rd.Send[0]); err != nil {
		t.Fatal(err)
	}
	if rd := m.Snapshot(r.snap(), 0); len(rd.Send) != 0 {
		t.Fatalf("joined twice: %+v", rd)
	}
}

// TestMachineJoinsInOrder: with WithJoinOrder the node joins only once the
// trainers before it are pending, whatever order the snapshots come in.
func TestMachineJoinsInOrder(t *testing.T) {
	r := newRun(t)
	m := New(r.ids[2], 0, false, keys())
	m.joinAfter = []coordinator.Pubkey{r.ids[0].Signer, r.ids[1].Signer}
	for i, id := range r.ids[:2] {
		if rd := m.Snapshot(r.snap(), 0); len(rd.Send) != 0 {
			t.Fatalf("joined before trainer %d: %+v", i, rd)
		}
		if err := r.apply(id.Signer, &coordinator.JoinRun{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	rd := m.Snapshot(r.snap(), 0)
	if len(rd.Send) != 1 || rd.Send[0].Name() != "join_run" {
		t.Fatalf("want a join after the two, got %+v", rd)
	}
	if err := r.apply(r.ids[2].Signer, rd.Send[0]); err != nil {
		t.Fatal(err)
	}
	if i, _ := r.s.PendingIndex(r.ids[2].Signer); i != 2 {
		t.Fatalf("joined at %d, want 2", i)
	}
}

// TestMachineJoinsFromItsFirstEpoch: with JoinFrom(1) the node lets the
// run's first epoch start without it, and joins when the run waits for the
// second epoch's members.
func TestMachineJoinsFromItsFirstEpoch(t *testing.T) {
	r := newRun(t)
	m := New(r.ids[2], 0, false, keys())
	m.JoinFrom(1)
	if rd := m.Snapshot(r.snap(), 0); len(rd.Send) != 0 {
		t.Fatalf("joined epoch 0: %+v", rd)
	}
	r.s.Progress.Epoch = 1 // the state as the first epoch's end leaves it
	rd := m.Snapshot(r.snap(), 0)
	if len(rd.Send) != 1 || rd.Send[0].Name() != "join_run" {
		t.Fatalf("want a join for epoch 1, got %+v", rd)
	}
}

// toTraining brings the run to its first RoundTrain with the machine as
// client 0, loaded, and returns the machine.
func toTraining(t *testing.T, r *run) *Machine {
	m := New(r.ids[0], 0, false, keys())
	for i, id := range r.ids {
		if err := r.apply(id.Signer, &coordinator.JoinRun{ID: id}); err != nil {
			t.Fatal(i, err)
		}
	}
	r.tick(1)
	if r.s.RunState != coordinator.Warmup {
		t.Fatalf("setup: %s", r.s.Describe())
	}
	rd := m.Snapshot(r.snap(), 0)
	if rd.Load == nil || rd.Load.Source == LoadKeep {
		t.Fatalf("want a fresh load in warmup, got %+v", rd)
	}
	rd = m.Loaded(rd.Load.Epoch)
	for _, ix := range rd.Send {
		if ix.Name() != "warmup_witness" {
			t.Fatalf("unexpected %s", ix.Name())
		}
		if err := r.apply(r.ids[0].Signer, ix); err != nil {
			t.Fatalf("warmup witness refused: %v", err)
		}
	}
	r.tick(5)
	if r.s.RunState != coordinator.RoundTrain {
		t.Fatalf("setup: %s", r.s.Describe())
	}
	return m
}

func announcement(r *run, trainer int, step uint32, b p2p.BatchRange) p2p.Announcement {
	return p2p.Announcement{RunID: "m", Step: step, Batch: b, Trainer: r.ids[trainer],
		Commitment: sha256.Sum256([]byte(fmt.Sprint(trainer, step, b.Start)))}
}

// step1Results returns each trainer's announcement of its batch of step 1,
// as the round now assigns them.
func step1Results(r *run) func(trainer int) p2p.Announcement {
	ranges := r.s.RoundAssignment(r.s.CurrentRound())
	return func(i int) p2p.Announcement {
		return announcement(r, i, 1, p2p.BatchRange{Start: ranges[i].Start, End: ranges[i].Start + ranges[i].Count})
	}
}

// trainedStep1 brings the run to its first round with the machine as
// client 0, which has trained and published its batch; it returns the
// machine and the others' announcements.
func trainedStep1(t *testing.T, r *run) (*Machine, func(trainer int) p2p.Announcement) {
	m := toTraining(t, r)
	rd := m.Snapshot(r.snap(), 0)
	m.Trained(announcement(r, 0, 1, rd.Train.Batch), distinctFrame(0), TrainStats{})
	return m, step1Results(r)
}

func TestMachineTrainsFetchesAndWitnesses(t *testing.T) {
	r := newRun(t)
	m := toTraining(t, r)
	rd := m.Snapshot(r.snap(), 0)
	if rd.Train == nil || rd.Train.Step != 1 || rd.Train.Batch.End-rd.Train.Batch.Start != 2 || rd.Train.LR != 0.5 {
		t.Fatalf("want this node's 2-sequence batch of step 1, got %+v", rd.Train)
	}
	if again := m.Snapshot(r.snap(), 0); again.Train != nil {
		t.Fatal("trained the same round twice")
	}
	frame := distinctFrame(0)
	m.Trained(announcement(r, 0, 1, rd.Train.Batch), frame, TrainStats{Loss: 2.5, TokensPerSec: 100, BytesPerSec: 50})

	var anns []p2p.Announcement
	for i := 1; i < 3; i++ {
		anns = append(anns, step1Results(r)(i))
	}
	if got := m.Announced(anns[0]); len(got.Fetch) != 1 {
		t.Fatalf("want a fetch, got %+v", got)
	}
	if got := m.Announced(anns[0]); len(got.Fetch) != 0 {
		t.Fatal("fetched the same result twice")
	}
	if got := m.Announced(announcement(r, 0, 1, rd.Train.Batch)); len(got.Fetch) != 0 {
		t.Fatal("fetched its own result")
	}
	// A fetch that failed in transit is tried again when announced again.
	m.Fetched(anns[1], nil, errors.New("timeout"), false)
	if got := m.Announced(anns[1]); len(got.Fetch) != 1 {
		t.Fatal("a transient failure stopped the result from being fetched again")
	}
	// A result that fails its checks is never fetched again.
	if got := m.Fetched(anns[1], nil, errors.New("bad frame"), true); len(got.Send) != 0 {
		t.Fatal("witnessed after a bad result")
	}
	if got := m.Announced(anns[1]); len(got.Fetch) != 0 {
		t.Fatal("refetched a rejected result")
	}
	// Trainer 1's result completes the round: trainer 2's result failed
	// its checks, so its batch is settled (no honest witness will vouch for
	// it) and an elected witness reports at once, leaving trainer 2 out,
	// instead of waiting for the training limit.
	rd = m.Fetched(anns[0], distinctFrame(1), nil, false)
	proof := r.s.Config.WitnessProofFor(r.s.CurrentRound(), 0)
	if !proof.IsWitness {
		if len(rd.Send) != 0 {
			t.Fatalf("a non-witness sent %+v", rd.Send)
		}
		return
	}
	if len(rd.Send) != 1 {
		t.Fatalf("want one witness report, got %+v", rd)
	}
	w := rd.Send[0].(*coordinator.WitnessRound).Report
	for i := 0; i < 3; i++ {
		if got := w.Participants.Has(w.Key, coordinator.ParticipantMember(r.ids[i].Signer)); got != (i != 2) {
			t.Errorf("trainer %d in the participant bloom: %v", i, got)
		}
	}
	if w.Broadcasts.Has(w.Key, anns[1].Commitment) {
		t.Error("the refused result is in the broadcast bloom")
	}
	if w.Metadata.Step != 1 || w.Metadata.Loss != 2.5 || w.Metadata.TokensPerSec != 100 || w.Metadata.BandwidthPerSec != 50 {
		t.Errorf("metadata %+v", w.Metadata)
	}
	// Trainer 2 then announces a second, different result for the same
	// batch: proof that it equivocated, reported to the network; neither
	// version is fetched and nothing more is witnessed.
	second := anns[1]
	second.Commitment[0] ^= 1
	if got := m.Announced(second); len(got.Fetch) != 0 || len(got.Send) != 0 || len(got.Report) != 1 || got.Report[0] != anns[1].Trainer.P2P {
		t.Fatalf("after equivocation: %+v", got)
	}
	if err := r.apply(r.ids[0].Signer, rd.Send[0]); err != nil {
		t.Fatalf("the coordinator refused the report: %v", err)
	}
}

func TestMachineLeavesWhenDone(t *testing.T) {
	r := newRun(t)
	m := New(r.ids[0], 1, false, keys())
	m.trained = 1
	if rd := m.Snapshot(r.snap(), 0); rd.Done == "" || len(rd.Send) != 0 {
		t.Fatalf("want to leave without joining, got %+v", rd)
	}
	r.s.RunState = coordinator.Finished
	if rd := New(r.ids[0], 0, false, keys()).Snapshot(r.snap(), 0); rd.Done == "" {
		t.Fatal("a finished run did not end the node")
	}
}

func TestMachinePullsWhatGossipLost(t *testing.T) {
	r := newRun(t)
	m := toTraining(t, r)
	m.Snapshot(r.snap(), 0)
	rd := m.Tick(r.now)
	if rd.Pull == nil || *rd.Pull != 1 {
		t.Fatalf("want a pull of step 1, got %+v", rd)
	}
	if again := m.Tick(r.now); again.Pull != nil {
		t.Fatal("a second pull while one is in flight")
	}
	a := step1Results(r)(1)
	if got := m.Pulled([]p2p.Announcement{a}); len(got.Fetch) != 1 {
		t.Fatalf("want the pulled result fetched, got %+v", got)
	}
}

// TestAssignmentsFollowTheRing: what the node pushes to the p2p validator is
// each held round's data assignment, at the round's step; nothing outside
// training; a round that has left the ring is no longer listed.
func TestAssignmentsFollowTheRing(t *testing.T) {
	r := newRun(t)
	if got := Assignments(r.snap()); got == nil || len(got) != 0 {
		t.Fatalf("before training: %v, want an empty (not nil) list", got)
	}
	toTraining(t, r)
	check := func(wantSteps ...uint32) {
		t.Helper()
		s := r.snap()
		got := Assignments(s)
		bySteps := map[uint32]int{}
		for _, a := range got {
			bySteps[a.Step]++
			rd := s.RoundAtHeight(a.Step - s.Epoch.StartStep)
			ranges := s.RoundAssignment(rd)
			found := false
			for i, d := range ranges {
				if d.Start == a.Batch.Start && d.Start+d.Count == a.Batch.End {
					found = s.Epoch.Clients[i].ID == a.Trainer
				}
			}
			if !found {
				t.Errorf("step %d batch %+v: not the coordinator's assignment to %x", a.Step, a.Batch, a.Trainer.Signer[:4])
			}
		}
		if len(bySteps) != len(wantSteps) {
			t.Fatalf("steps %v listed, want %v", bySteps, wantSteps)
		}
		for _, st := range wantSteps {
			if bySteps[st] != 3 { // three clients, 6 sequences: two each
				t.Errorf("step %d: %d batches, want 3", st, bySteps[st])
			}
		}
	}
	check(1)
	// Later rounds, as the coordinator lays them out in its ring of four:
	// height h in slot h mod 4, data following on, a seed of its own.
	first := r.s.Epoch.Rounds[0]
	for h := uint32(1); h <= 5; h++ {
		rd := first
		rd.Height, rd.DataIndex, rd.RandomSeed = h, first.DataIndex+uint64(h)*6, first.RandomSeed+uint64(h)
		slot := uint8(h % coordinator.NumRounds)
		r.s.Epoch.Rounds[slot] = rd
		r.s.Epoch.CurrentRound = slot
		r.s.Progress.Step = r.s.Epoch.StartStep + h
		var want []uint32
		for back := uint32(0); back <= min(h, 3); back++ {
			want = append(want, r.s.Epoch.StartStep+h-back)
		}
		check(want...)
	}
	r.s.RunState = coordinator.WaitingForMembers
	if got := Assignments(r.snap()); len(got) != 0 {
		t.Fatalf("after the epoch: %v", got)
	}
}

// TestMachineEquivocationEvidenceIsBounded: evidence is one record per batch
// and step however many versions a trainer signs, a result fetched after the
// evidence is not kept, and the records go when their step ages out.
func TestMachineEquivocationEvidenceIsBounded(t *testing.T) {
	r := newRun(t)
	m := toTraining(t, r)
	m.Snapshot(r.snap(), 0)
	ann := step1Results(r)
	first := ann(1)
	if rd := m.Announced(first); len(rd.Fetch) != 1 {
		t.Fatalf("want the first version fetched, got %+v", rd)
	}
	for v := byte(1); v <= 5; v++ {
		other := first
		other.Commitment[0] ^= v
		if rd := m.Announced(other); len(rd.Fetch) != 0 {
			t.Fatalf("version %d fetched", v)
		}
	}
	if n := len(m.claims[1]); n != 1 || !m.equivocated(1, first.Batch.Start) {
		t.Fatalf("%d records for step 1 (equivocated: %v), want 1", n, m.equivocated(1, first.Batch.Start))
	}
	m.Fetched(first, &distro.Frame{}, nil, false)
	if m.results[1][first.Batch.Start] != nil {
		t.Fatal("kept a result fetched after its trainer was caught equivocating")
	}
	// A different trainer's batch is not affected.
	other := ann(2)
	if rd := m.Announced(other); len(rd.Fetch) != 1 || m.equivocated(1, other.Batch.Start) {
		t.Fatal("an honest trainer's result was refused")
	}
	later := r.snap()
	later.RunState = coordinator.WaitingForMembers
	later.Progress.Step += 5
	m.Snapshot(later, 0)
	if len(m.claims) != 0 {
		t.Fatalf("evidence of old steps kept: %v", m.claims)
	}
}

// TestMachineOutvotedVersion: with two versions of a result, a split
// committee can give each a quorum. A node holding one sees that witnesses
// counted the trainer without voting for its version.
func TestMachineOutvotedVersion(t *testing.T) {
	trainer := clientID(1).Signer
	v1, v2 := sha256.Sum256([]byte("v1")), sha256.Sum256([]byte("v2"))
	var round coordinator.Round
	round.WitnessesLen = 4
	for i := range 4 {
		w := &round.Witnesses[i]
		w.Key = uint64(i) + 1
		w.Participants.Add(w.Key, coordinator.ParticipantMember(trainer))
		w.Broadcasts.Add(w.Key, map[bool]coordinator.Hash{true: v1, false: v2}[i < 2])
	}
	m := New(clientID(0), 0, false, keys())
	res := &result{ann: p2p.Announcement{Trainer: clientID(1), Commitment: v1}}
	if !m.outvoted(&round, res, trainer) {
		t.Fatal("half the witnesses voted for another version, and v1 is not outvoted")
	}
	for i := 2; i < 4; i++ { // every witness saw v1
		w := &round.Witnesses[i]
		w.Broadcasts.Add(w.Key, v1)
	}
	if m.outvoted(&round, res, trainer) {
		t.Fatal("v1 is outvoted though every witness that counted the trainer voted for it")
	}
}

// TestMachineRefusesCopies: a result that says what another trainer's
// already said (here rescaled) is no work of its own: refused, reported, and
// left out of the witness report; so is a trainer's replay of its own
// earlier result.
func TestMachineRefusesCopies(t *testing.T) {
	r := newRun(t)
	m, ann := trainedStep1(t, r)
	original := &distro.Frame{Tensors: []distro.Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 2, Indices: []uint32{1, 6}, Values: []float32{0.5, -2}}}}
	scaled := &distro.Frame{Tensors: []distro.Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 2, Indices: []uint32{1, 6}, Values: []float32{5, -20}}}}
	for i := 1; i < 3; i++ {
		m.Announced(ann(i))
	}
	if got := m.Fetched(ann(1), original, nil, false); len(got.Refused) != 0 {
		t.Fatalf("the original was refused: %+v", got.Refused)
	}
	got := m.Fetched(ann(2), scaled, nil, false)
	if len(got.Refused) != 1 || got.Refused[0].Trainer != r.ids[2] || got.Refused[0].Step != 1 {
		t.Fatalf("the rescaled copy: refused %+v, want trainer 2 at step 1", got.Refused)
	}
	if again := m.Announced(ann(2)); len(again.Fetch) != 0 {
		t.Fatal("a refused copy was fetched again")
	}
	if proof := r.s.Config.WitnessProofFor(r.s.CurrentRound(), 0); proof.IsWitness {
		if len(got.Send) != 1 {
			t.Fatalf("want the witness report once the copy settled its batch, got %+v", got.Send)
		}
		w := got.Send[0].(*coordinator.WitnessRound).Report
		for i := 0; i < 3; i++ {
			if in := w.Participants.Has(w.Key, coordinator.ParticipantMember(r.ids[i].Signer)); in != (i != 2) {
				t.Errorf("trainer %d in the participant bloom: %v", i, in)
			}
		}
	}
	// A replay: trainer 1 sends at a later step what it sent at step 1.
	replay := announcement(r, 1, 2, p2p.BatchRange{Start: 100, End: 102})
	if !m.copied(replay, original) {
		t.Fatal("a replay of the trainer's own earlier result was not caught")
	}
	if m.copied(ann(1), original) {
		t.Fatal("the same result of the same step, seen again, was taken for a copy")
	}
}

// TestMachineDoesNotWaitForDistrusted: once this node refused a trainer's
// result, it does not wait for that trainer's results for distrustSteps
// (the network ignores it for a while, so they may never come), nor for a
// trainer whose verified work is failing; others are waited for.
func TestMachineDoesNotWaitForDistrusted(t *testing.T) {
	r := newRun(t)
	m, ann := trainedStep1(t, r)
	bad := ann(2)
	m.Announced(bad)
	m.Fetched(bad, nil, errors.New("bad frame"), true)
	lazy := clientID(7).Signer
	m.bookOf(lazy).flagged = true
	for _, tc := range []struct {
		name    string
		step    uint32
		trainer coordinator.Pubkey
		want    bool
	}{
		{"refused, the same step", 1, r.ids[2].Signer, true},
		{"refused, a later step", 1 + distrustSteps, r.ids[2].Signer, true},
		{"refused long ago", 2 + distrustSteps, r.ids[2].Signer, false},
		{"never refused", 3, r.ids[1].Signer, false},
		{"failing its verified work", 3, lazy, true},
	} {
		if got := m.settledWithout(tc.step, owedBatch{start: 1000, trainer: tc.trainer}); got != tc.want {
			t.Errorf("%s: settled without it: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMachineWitnessesWhenTheRefusedResultComesLast: a witness that has
// every other result of the round reports as soon as the one it still
// lacked turns out bad (its fetch is invalid, or it is a copy), not at the
// next unrelated event. Seen in localnet: a refused frame was the last
// event of a round, the report waited for the round's training limit, and
// in virtual time that limit spent the whole epoch.
func TestMachineWitnessesWhenTheRefusedResultComesLast(t *testing.T) {
	good := &distro.Frame{Tensors: []distro.Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 2, Indices: []uint32{1, 6}, Values: []float32{0.5, -2}}}}
	for _, tc := range []struct {
		name   string
		settle func(m *Machine, a p2p.Announcement) Ready
	}{
		{"an invalid frame", func(m *Machine, a p2p.Announcement) Ready {
			return m.Fetched(a, nil, errors.New("bad frame"), true)
		}},
		{"a copy", func(m *Machine, a p2p.Announcement) Ready { return m.Fetched(a, good, nil, false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(t)
			m := toTraining(t, r)
			if !r.s.Config.WitnessProofFor(r.s.CurrentRound(), 0).IsWitness {
				t.Fatal("setup: this node is no witness of the round")
			}
			rd := m.Snapshot(r.snap(), 0)
			m.Trained(announcement(r, 0, 1, rd.Train.Batch), distinctFrame(0), TrainStats{})
			ann := step1Results(r)
			m.Announced(ann(1))
			m.Announced(ann(2))
			if got := m.Fetched(ann(1), good, nil, false); len(got.Send) != 0 {
				t.Fatalf("reported with trainer 2's result still due: %+v", got.Send)
			}
			got := tc.settle(m, ann(2))
			if len(got.Send) != 1 {
				t.Fatalf("want the witness report once the last result was refused, got %+v", got.Send)
			}
			w := got.Send[0].(*coordinator.WitnessRound).Report
			for i := 0; i < 3; i++ {
				if in := w.Participants.Has(w.Key, coordinator.ParticipantMember(r.ids[i].Signer)); in != (i != 2) {
					t.Errorf("trainer %d in the participant bloom: %v", i, in)
				}
			}
		})
	}
}

// TestMachineDropsFetchesWhenDropped: a node that a health check dropped
// asks its driver to cancel the fetches it has started (its peers may
// never answer it), and fetches nothing of the epoch after that.
func TestMachineDropsFetchesWhenDropped(t *testing.T) {
	r := newRun(t)
	m, ann := trainedStep1(t, r)
	a := ann(1)
	if got := m.Announced(a); len(got.Fetch) != 1 {
		t.Fatalf("setup: want a fetch, got %+v", got)
	}
	if got := m.Snapshot(r.snap(), 0); got.DropFetches {
		t.Fatal("a client of the epoch dropped its fetches")
	}
	dropped := r.snap()
	dropped.Epoch.Clients[0].State = coordinator.Dropped
	if got := m.Snapshot(dropped, 0); !got.DropFetches {
		t.Fatalf("dropped with a fetch in flight: want DropFetches, got %+v", got)
	}
	if got := m.Snapshot(dropped, 0); got.DropFetches {
		t.Fatal("asked to drop the fetches twice")
	}
	if got := m.Announced(ann(2)); len(got.Fetch) != 0 {
		t.Fatalf("a dropped node fetched %+v", got.Fetch)
	}
}
