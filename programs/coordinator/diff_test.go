package coordinator_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"testing"

	coord "github.com/psyche-go/psyche/coordinator"
)

func key(name string) coord.Pubkey { return coord.Pubkey(sha256.Sum256([]byte(name))) }

func clientID(i int) coord.ClientID {
	return coord.ClientID{Signer: key(fmt.Sprint("signer", i)), P2P: key(fmt.Sprint("p2p", i))}
}

func testConfig() coord.Config {
	return coord.Config{WarmupTime: 10, CooldownTime: 10, MaxRoundTrainTime: 20, RoundWitnessTime: 5, EpochTime: 100,
		WaitingForMembersExtraTime: 2, TotalSteps: 100, GlobalBatchSizeStart: 6, GlobalBatchSizeEnd: 12,
		GlobalBatchSizeWarmupTokens: 8 * 16, InitMinClients: 3, MinClients: 2, WitnessNodes: 2}
}

func testModel() coord.Model {
	m := coord.Model{Architecture: coord.ArchGPT, DataKind: coord.DataLocal, TokenSize: 2, MaxSeqLen: 8, VocabSize: 256,
		DModel: 32, NLayers: 2, NHeads: 4,
		LR:        coord.LRSchedule{Kind: coord.LRConstant, BaseLR: 0.001},
		Optimizer: coord.Optimizer{Kind: coord.OptimizerDistro, CompressionDecay: 0.999, CompressionTopK: 4, CompressionChunk: 8, Quantize1Bit: true}}
	m.Checkpoint.Kind = coord.CheckpointP2P
	_ = coord.SetFixedString(m.Checkpoint.Source.URL[:], "file:///models/tiny")
	_ = coord.SetFixedString(m.DataLocation[:], "data/tokens.bin")
	return m
}

// world drives one run through both implementations.
type world struct {
	t     *testing.T
	h     *harness
	acct  []byte
	now   uint64
	steps int
	// seen counts (instruction, result code) pairs, to show what a test reached.
	seen   map[string]int
	states [8]bool
}

func newWorld(t *testing.T) *world {
	return &world{t: t, h: startHarness(t), acct: make([]byte, coord.AccountSize), now: 1_700_000_000,
		seen: map[string]int{}}
}

// apply runs data on both sides, fails the test on any difference, and adopts
// the new account bytes. It returns the result code.
func (w *world) apply(label string, data []byte, ctx coord.Context) uint32 {
	w.t.Helper()
	w.steps++
	goRes := goRun(w.acct, data, ctx)
	cRes, kind := w.h.run(w.t, w.acct, data, ctx)
	if d := diff(goRes, cRes); d != "" {
		w.t.Fatalf("step %d (%s): %s", w.steps, label, d)
	}
	if cRes.code != 0 && !bytes.Equal(cRes.acct, w.acct) {
		w.t.Fatalf("step %d (%s): C rejected the instruction (%s) but changed the account", w.steps, label, codeName(cRes.code))
	}
	name := "?"
	if names := coord.InstructionNames(); kind < uint64(len(names)) {
		name = names[kind]
	}
	w.seen[name+" "+codeName(cRes.code)]++
	w.acct = goRes.acct
	if s, err := coord.DecodeAccount(w.acct); err == nil {
		w.states[s.RunState] = true
	}
	return cRes.code
}

// probe runs data on a modified copy of the account without adopting it.
func (w *world) probe(label string, acct, data []byte, ctx coord.Context) uint32 {
	w.t.Helper()
	goRes := goRun(acct, data, ctx)
	cRes, _ := w.h.run(w.t, acct, data, ctx)
	if d := diff(goRes, cRes); d != "" {
		w.t.Fatalf("probe (%s): %s", label, d)
	}
	return cRes.code
}

func (w *world) state() *coord.Coordinator {
	s, err := coord.DecodeAccount(w.acct)
	if err != nil {
		w.t.Fatalf("account does not decode: %v", err)
	}
	return s
}

// do applies an instruction and requires the given code.
func (w *world) do(want uint32, ix coord.Instruction, ctx coord.Context) {
	w.t.Helper()
	if ctx.Now == 0 {
		ctx.Now = w.now
	}
	if got := w.apply(ix.Name(), coord.EncodeInstruction(ix), ctx); got != want {
		w.t.Fatalf("step %d (%s): got %s, want %s", w.steps, ix.Name(), codeName(got), codeName(want))
	}
}

func (w *world) tickUntil(st coord.RunState, seed uint64) {
	w.t.Helper()
	for i := 0; i < 200; i++ {
		if w.state().RunState == st {
			return
		}
		w.now++
		// Go and C must agree either way (apply compares them); a tick in a
		// second where nothing is due is refused, which is not a failure here.
		ctx := coord.Context{Sender: key("anyone"), Now: w.now, Seed: seed + uint64(i)}
		if got := w.apply("tick", coord.EncodeInstruction(&coord.Tick{}), ctx); got != 0 && got != coord.ErrNothingDue.Code {
			w.t.Fatalf("step %d (tick): got %s", w.steps, codeName(got))
		}
	}
	w.t.Fatalf("never reached %s (at %s)", st, w.state().RunState)
}

// witnessReport builds a witness report of client index i for the current
// round, with every client but the skipped ones in its participant bloom.
func witnessReport(s *coord.Coordinator, i uint16, k uint64, skip map[uint16]bool) coord.Witness {
	r := s.CurrentRound()
	w := coord.Witness{Proof: s.Config.WitnessProofFor(r, i), Key: k}
	for j := uint16(0); j < s.Epoch.ClientsLen; j++ {
		if !skip[j] {
			w.Participants.Add(k, coord.ParticipantMember(s.Epoch.Clients[j].ID.Signer))
		}
	}
	w.Broadcasts.Add(k, coord.Hash(sha256.Sum256([]byte(fmt.Sprint("batch", r.Height)))))
	w.Merkle = coord.Hash(sha256.Sum256([]byte(fmt.Sprint("merkle", k))))
	w.Metadata = coord.WitnessMetadata{Step: s.Progress.Step, TokensPerSec: 123.5, Loss: 2.25}
	return w
}

func ctxOf(sender coord.Pubkey) coord.Context { return coord.Context{Sender: sender} }

// TestScenarioFullRun walks a run through every state with valid and invalid
// instructions at each point.
func TestScenarioFullRun(t *testing.T) {
	w := newWorld(t)
	admin, joinAuth := key("admin"), key("join-authority")
	var runID [coord.MaxRunIDLen]byte
	copy(runID[:], "run-1")

	// Before init: nothing but init_coordinator reads a blank account.
	w.do(coord.ErrWrongDiscriminator.Code, &coord.Tick{}, ctxOf(admin))
	w.do(coord.ErrInvalidRunID.Code, &coord.InitCoordinator{MainAuthority: admin}, ctxOf(admin))
	bad := runID
	bad[3] = '/'
	w.do(coord.ErrInvalidRunID.Code, &coord.InitCoordinator{MainAuthority: admin, RunID: bad}, ctxOf(admin))
	w.do(coord.ErrInvalidAuthority.Code, &coord.InitCoordinator{RunID: runID}, ctxOf(admin))
	// Only the main authority it names may sign a run's creation.
	w.do(coord.ErrUnauthorized.Code, &coord.InitCoordinator{MainAuthority: admin, JoinAuthority: joinAuth, RunID: runID}, ctxOf(joinAuth))
	w.do(0, &coord.InitCoordinator{MainAuthority: admin, JoinAuthority: joinAuth, RunID: runID}, ctxOf(admin))
	w.do(coord.ErrAlreadyInitialized.Code, &coord.InitCoordinator{MainAuthority: admin, RunID: runID}, ctxOf(admin))

	// Configure and resume.
	k, m := testConfig(), testModel()
	w.do(coord.ErrHalted.Code, &coord.Tick{}, ctxOf(admin))
	w.do(coord.ErrInvalidConfig.Code, &coord.SetPaused{Paused: false}, ctxOf(admin))
	badK := k
	badK.WitnessNodes = 3
	w.do(coord.ErrInvalidConfig.Code, &coord.Update{Config: &badK}, ctxOf(admin))
	badM := m
	badM.Checkpoint.Kind = coord.CheckpointEphemeral
	w.do(coord.ErrInvalidModel.Code, &coord.Update{Config: &k, Model: &badM}, ctxOf(admin))
	w.do(coord.ErrUnauthorized.Code, &coord.Update{Config: &k, Model: &m}, ctxOf(key("mallory")))
	var md coord.Metadata
	copy(md.Name[:], "tiny run")
	md.NumParameters = 12345
	w.do(0, &coord.Update{Metadata: &md, Config: &k, Model: &m}, ctxOf(admin))
	w.do(coord.ErrAlreadyPaused.Code, &coord.SetPaused{Paused: true}, ctxOf(admin))
	w.do(0, &coord.SetPaused{Paused: false}, ctxOf(admin))
	w.do(coord.ErrNotHalted.Code, &coord.Update{Config: &k}, ctxOf(admin))
	w.do(0, &coord.Update{Metadata: &md}, ctxOf(admin))
	w.do(coord.ErrNotHalted.Code, &coord.FreeCoordinator{}, ctxOf(admin))

	// Joins, with and without the join authority.
	const n = 5
	for i := 0; i < n; i++ {
		id := clientID(i)
		w.do(coord.ErrJoinNotAuthorized.Code, &coord.JoinRun{ID: id}, ctxOf(id.Signer))
		w.do(coord.ErrSignerMismatch.Code, &coord.JoinRun{ID: id}, coord.Context{Sender: key("x"), CoSigner: joinAuth})
		w.do(0, &coord.JoinRun{ID: id}, coord.Context{Sender: id.Signer, CoSigner: joinAuth})
	}
	dup := clientID(7)
	dup.P2P = clientID(0).P2P
	w.do(coord.ErrDuplicateP2PIdentity.Code, &coord.JoinRun{ID: dup}, coord.Context{Sender: dup.Signer, CoSigner: joinAuth})
	w.do(coord.ErrInvalidClientID.Code, &coord.JoinRun{ID: coord.ClientID{Signer: dup.Signer}}, coord.Context{Sender: dup.Signer, CoSigner: joinAuth})
	w.do(0, &coord.JoinRun{ID: clientID(0)}, coord.Context{Sender: clientID(0).Signer, CoSigner: joinAuth}) // refresh

	// Warmup, with warmup witnesses ending it early.
	w.do(coord.ErrNothingDue.Code, &coord.Tick{}, coord.Context{Sender: key("anyone"), Now: w.now}) // the second the state began: nothing
	w.tickUntil(coord.Warmup, 11)
	s := w.state()
	r := s.CurrentRound()
	witnesses := 0
	for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
		p := s.Config.WitnessProofFor(r, i)
		id := s.Epoch.Clients[i].ID
		if !p.IsWitness {
			rep := witnessReport(s, i, 5, nil)
			w.do(coord.ErrNotAWitness.Code, &coord.WarmupWitness{Report: rep}, ctxOf(id.Signer))
			rep.Proof.IsWitness = true
			w.do(coord.ErrInvalidProof.Code, &coord.WarmupWitness{Report: rep}, ctxOf(id.Signer))
			continue
		}
		rep := witnessReport(s, i, 5, nil)
		w.do(coord.ErrInvalidProof.Code, &coord.WarmupWitness{Report: rep}, ctxOf(key("mallory")))
		rep.Proof.Index = 300
		w.do(coord.ErrInvalidProof.Code, &coord.WarmupWitness{Report: rep}, ctxOf(id.Signer))
		rep = witnessReport(s, i, 5, nil)
		// The seed drawn as the first round starts is the second round's
		// (NextRoundSeed): 102 keeps client 4, which a health check drops
		// during the second round, out of that round's two witnesses.
		w.do(0, &coord.WarmupWitness{Report: rep}, coord.Context{Sender: id.Signer, Now: w.now, Seed: 102})
		witnesses++
		if w.state().RunState == coord.Warmup {
			w.do(coord.ErrDuplicateWitness.Code, &coord.WarmupWitness{Report: rep}, ctxOf(id.Signer))
		}
	}
	if witnesses == 0 || w.state().RunState != coord.RoundTrain {
		t.Fatalf("warmup witnesses did not start the first round (state %s)", w.state().RunState)
	}

	// Rounds: witnesses leave client 4 out of their blooms, so it fails its
	// health check in the next round.
	skip := map[uint16]bool{4: true}
	dropped := false
	for round := 0; round < 4; round++ {
		s = w.state()
		r = s.CurrentRound()
		if round > 0 && !dropped {
			// Health checks against the previous round.
			var checker coord.Pubkey
			for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
				if s.Epoch.Clients[i].ID != clientID(4) {
					checker = s.Epoch.Clients[i].ID.Signer
				}
			}
			for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
				id := s.Epoch.Clients[i].ID
				p := s.Config.HealthCheckProofFor(r, i)
				if id == clientID(4) {
					bp := p
					bp.Position ^= 1
					w.do(coord.ErrInvalidProof.Code, &coord.HealthCheck{ID: id, Proof: bp}, ctxOf(checker))
					w.do(coord.ErrNotAClient.Code, &coord.HealthCheck{ID: id, Proof: p}, ctxOf(key("outsider")))
					w.do(0, &coord.HealthCheck{ID: id, Proof: p}, ctxOf(checker))
					w.do(coord.ErrClientNotHealthy.Code, &coord.HealthCheck{ID: id, Proof: p}, ctxOf(checker))
					dropped = true
				} else {
					w.do(coord.ErrClientHealthy.Code, &coord.HealthCheck{ID: id, Proof: p}, ctxOf(checker))
				}
			}
		} else if round == 0 {
			w.do(coord.ErrNoPreviousRound.Code, &coord.HealthCheck{ID: s.Epoch.Clients[0].ID, Proof: s.Config.HealthCheckProofFor(r, 0)}, ctxOf(s.Epoch.Clients[1].ID.Signer))
		}
		s = w.state() // a health check may have just dropped a witness
		for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
			p := s.Config.WitnessProofFor(r, i)
			if !p.IsWitness || s.Epoch.Clients[i].State != coord.Healthy {
				continue
			}
			rep := witnessReport(s, i, uint64(round)*7+uint64(i), skip)
			rep.Metadata.Step++
			w.do(coord.ErrWrongStep.Code, &coord.WitnessRound{Report: rep}, ctxOf(s.Epoch.Clients[i].ID.Signer))
			rep.Metadata.Step--
			w.do(0, &coord.WitnessRound{Report: rep}, coord.Context{Sender: s.Epoch.Clients[i].ID.Signer, Now: w.now})
		}
		w.do(coord.ErrWrongState.Code, &coord.RecordCheckpoint{}, ctxOf(admin))
		w.tickUntil(coord.RoundWitness, 1000)
		w.now += 10
		w.do(0, &coord.Tick{}, coord.Context{Sender: key("anyone"), Now: w.now, Seed: uint64(round) + 77})
	}
	if !dropped {
		t.Fatal("no health check dropped client 4")
	}

	// Pause while training: pending until the round ends, then cooldown.
	w.do(0, &coord.SetPaused{Paused: true}, ctxOf(admin))
	w.do(coord.ErrAlreadyPaused.Code, &coord.SetPaused{Paused: true}, ctxOf(admin))
	w.do(0, &coord.SetPaused{Paused: false}, ctxOf(admin)) // cancels the pending pause
	w.do(coord.ErrNotPaused.Code, &coord.SetPaused{Paused: false}, ctxOf(admin))
	w.do(0, &coord.SetPaused{Paused: true}, ctxOf(admin))
	for w.state().RunState != coord.Cooldown {
		s = w.state()
		r = s.CurrentRound()
		if s.RunState == coord.RoundTrain {
			for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
				if s.Config.WitnessProofFor(r, i).IsWitness {
					w.do(0, &coord.WitnessRound{Report: witnessReport(s, i, 3, nil)}, coord.Context{Sender: s.Epoch.Clients[i].ID.Signer, Now: w.now})
				}
			}
		}
		w.now += 6
		w.do(0, &coord.Tick{}, coord.Context{Sender: key("anyone"), Now: w.now, Seed: 5})
	}

	// Checkpoint: only an elected checkpointer or the authority.
	s = w.state()
	var src coord.CheckpointSource
	copy(src.URL[:], "https://example.com/ckpt")
	copy(src.Revision[:], "abc")
	w.do(coord.ErrInvalidCheckpoint.Code, &coord.RecordCheckpoint{}, ctxOf(admin))
	elected, notElected := -1, -1
	for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
		if s.IsCheckpointer(i) {
			elected = int(i)
		} else if s.Epoch.Clients[i].State == coord.Healthy {
			notElected = int(i)
		}
	}
	if notElected >= 0 {
		w.do(coord.ErrNotCheckpointer.Code, &coord.RecordCheckpoint{Source: src}, ctxOf(s.Epoch.Clients[notElected].ID.Signer))
	}
	w.do(coord.ErrNotAClient.Code, &coord.RecordCheckpoint{Source: src}, ctxOf(key("outsider")))
	sender := admin
	if elected >= 0 && s.Epoch.Clients[elected].State == coord.Healthy {
		sender = s.Epoch.Clients[elected].ID.Signer
	}
	w.do(0, &coord.RecordCheckpoint{Source: src}, ctxOf(sender))
	w.do(coord.ErrAlreadyCheckpointed.Code, &coord.RecordCheckpoint{Source: src}, ctxOf(admin))
	w.now++
	w.do(0, &coord.Tick{}, coord.Context{Sender: key("anyone"), Now: w.now})
	if st := w.state().RunState; st != coord.Paused {
		t.Fatalf("after the checkpoint: %s, want Paused", st)
	}

	// Rewrite progress while paused, resume, finish, free.
	w.do(0, &coord.Update{Progress: &coord.Progress{Step: 100, Epoch: 3}}, ctxOf(admin))
	w.do(coord.ErrInvalidProgress.Code, &coord.SetPaused{Paused: false}, ctxOf(admin))
	w.do(0, &coord.Update{Progress: &coord.Progress{Step: 99, Epoch: 3, EpochStartDataIndex: 1000}}, ctxOf(admin))
	w.do(0, &coord.SetPaused{Paused: false}, ctxOf(admin))
	// Client 4, dropped in the epoch that ended, joins first and sits the
	// next one out: the other three are enough.
	for _, i := range []int{4, 0, 1, 2} {
		id := clientID(i)
		w.do(0, &coord.JoinRun{ID: id}, coord.Context{Sender: id.Signer, CoSigner: joinAuth})
	}
	w.tickUntil(coord.Warmup, 300)
	if s = w.state(); s.Epoch.ClientsLen != 3 || s.Epoch.Clients[0].ID != clientID(0) {
		t.Fatalf("the warmup admitted %d clients, the first %x; want clients 0, 1 and 2", s.Epoch.ClientsLen, s.Epoch.Clients[0].ID.Signer[:4])
	}
	w.now += 11
	w.tickUntil(coord.RoundTrain, 400)
	s = w.state()
	r = s.CurrentRound()
	for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
		if s.Config.WitnessProofFor(r, i).IsWitness {
			w.do(0, &coord.WitnessRound{Report: witnessReport(s, i, 9, nil)}, coord.Context{Sender: s.Epoch.Clients[i].ID.Signer, Now: w.now})
		}
	}
	w.tickUntil(coord.Cooldown, 500)
	w.tickUntil(coord.Finished, 600)
	w.do(coord.ErrFinished.Code, &coord.SetPaused{Paused: false}, ctxOf(admin))
	w.do(coord.ErrFinished.Code, &coord.Update{Metadata: &md}, ctxOf(admin))
	w.do(coord.ErrHalted.Code, &coord.Tick{}, ctxOf(admin))
	w.do(coord.ErrUnauthorized.Code, &coord.FreeCoordinator{}, ctxOf(key("mallory")))
	w.do(0, &coord.FreeCoordinator{}, ctxOf(admin))
	for st := coord.WaitingForMembers; st <= coord.Paused; st++ {
		if !w.states[st] {
			t.Errorf("the scenario never reached %s", st)
		}
	}
}

// TestMalformedInstructions sends truncated, extended and corrupted
// instruction data and corrupted accounts to both sides.
func TestMalformedInstructions(t *testing.T) {
	w := newWorld(t)
	admin := key("admin")
	var runID [coord.MaxRunIDLen]byte
	copy(runID[:], "bad-input")
	w.do(0, &coord.InitCoordinator{MainAuthority: admin, RunID: runID}, ctxOf(admin))
	k, m := testConfig(), testModel()
	var md coord.Metadata
	ixs := []coord.Instruction{
		&coord.InitCoordinator{MainAuthority: admin, RunID: runID},
		&coord.Update{Metadata: &md, Config: &k, Model: &m, Progress: &coord.Progress{}},
		&coord.SetPaused{Paused: true}, &coord.JoinRun{ID: clientID(1)}, &coord.Tick{},
		&coord.WarmupWitness{Report: coord.Witness{Proof: coord.WitnessProof{IsWitness: true}}},
		&coord.WitnessRound{Report: coord.Witness{Proof: coord.WitnessProof{IsWitness: true}}},
		&coord.HealthCheck{ID: clientID(1), Proof: coord.WitnessProof{IsWitness: true}},
		&coord.RecordCheckpoint{}, &coord.FreeCoordinator{},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := coord.Context{Sender: admin, Now: w.now, Seed: 1}
	for _, ix := range ixs {
		data := coord.EncodeInstruction(ix)
		for n := 0; n <= len(data); n++ { // every truncation
			if n > 40 && n < len(data)-40 && n%7 != 0 {
				continue
			}
			w.probe(ix.Name()+" truncated", w.acct, data[:n], ctx)
		}
		w.probe(ix.Name()+" extended", w.acct, append(append([]byte(nil), data...), 0), ctx)
		for i := 0; i < 200; i++ { // single corrupted bytes (paddings, booleans, option tags, values)
			c := append([]byte(nil), data...)
			c[rng.IntN(len(c))] ^= byte(1 + rng.IntN(255))
			w.probe(ix.Name()+" corrupted", w.acct, c, ctx)
		}
		// Corrupted accounts under a valid instruction.
		for i := 0; i < 60; i++ {
			a := append([]byte(nil), w.acct...)
			switch i % 3 {
			case 0:
				a[rng.IntN(1024)] ^= byte(1 + rng.IntN(255))
			case 1:
				a[rng.IntN(len(a))] ^= byte(1 + rng.IntN(255))
			default:
				// lengths and enums that index arrays
				offs := []int{120, 121, 146328, 146330, 162720, 146332, 23358, 23356, 91080, 812, 414}
				a[offs[rng.IntN(len(offs))]] = byte(rng.IntN(256))
			}
			w.probe(ix.Name()+" on a corrupted account", a, data, ctx)
		}
		w.probe(ix.Name()+" short account", w.acct[:len(w.acct)-8], data, ctx)
	}
	for i := 0; i < 300; i++ { // random bytes, sometimes behind a real discriminator
		data := make([]byte, rng.IntN(800))
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		if len(data) >= 8 && i%2 == 0 {
			d := coord.InstructionDiscriminator(coord.InstructionNames()[rng.IntN(10)])
			copy(data, d[:])
		}
		w.probe("random bytes", w.acct, data, ctx)
	}
}
