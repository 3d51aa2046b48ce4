package coordinator

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"testing"
)

func FuzzDecodeAccount(f *testing.F) {
	for _, s := range sampleStates(f) {
		f.Add(s.MarshalAccount())
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeAccount(data)
		if err != nil {
			return
		}
		if !bytes.Equal(s.MarshalAccount(), data) {
			t.Fatal("encode(decode(x)) != x")
		}
		// Every method must be safe on anything the decoder accepts.
		ctx := Context{Sender: s.MainAuthority, Now: s.RunStateStart + 1000, Seed: 1}
		for _, ix := range newInstructions() {
			c := *s
			_, _ = c.Apply(ctx, ix)
		}
		_ = s.Describe()
		_ = s.RoundAssignment(s.CurrentRound())
	})
}

func FuzzDecodeInstruction(f *testing.F) {
	for _, ix := range newInstructions() {
		f.Add(EncodeInstruction(ix))
	}
	m, k := tinyModel(), tinyConfig()
	f.Add(EncodeInstruction(&Update{Model: &m, Config: &k, Progress: &Progress{Step: 3}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		ix, err := DecodeInstruction(data)
		if err != nil {
			return
		}
		if !bytes.Equal(EncodeInstruction(ix), data) {
			t.Fatalf("%s: encode(decode(x)) != x", ix.Name())
		}
	})
}

// FuzzInstructionSequence reads the input as a program of instructions from
// eight clients and the authority, applies it, and checks the invariants after
// every step: no panic, capacities respected, a failed instruction changes
// nothing, the nonce moves exactly when the state does, the step never goes
// back (except by an explicit progress update), and the account round-trips.
func FuzzInstructionSequence(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add(bytes.Repeat([]byte{2, 0, 2, 1, 2, 2, 5, 40, 6, 0, 6, 1, 5, 30, 7, 0, 7, 1, 5, 9}, 8))
	f.Add(bytes.Repeat([]byte{2, 0, 2, 1, 2, 2, 5, 3, 5, 3, 6, 0, 6, 1, 6, 2, 5, 9, 7, 0, 7, 1, 7, 2, 5, 6, 8, 2, 9, 0, 5, 20}, 6))
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 600 { // 300 instructions reach every state; longer only slows the search
			prog = prog[:600]
		}
		runProgram(t, prog)
	})
}

// runProgram runs prog and returns the set of run states it visited.
func runProgram(t *testing.T, prog []byte) (visited [numRunStates]bool) {
	admin := Pubkey(sha256.Sum256([]byte("admin")))
	client := func(b byte) ClientID {
		i := b % 8
		return ClientID{Signer: sha256.Sum256([]byte{'s', i}), P2P: sha256.Sum256([]byte{'p', i})}
	}
	var runID [MaxRunIDLen]byte
	copy(runID[:], "fuzz")
	s, err := New(InitCoordinator{MainAuthority: admin, RunID: runID})
	if err != nil {
		t.Fatal(err)
	}
	k, m := tinyConfig(), tinyModel()
	k.MinClients, k.InitMinClients, k.WitnessNodes, k.TotalSteps = 2, 3, 0, 12
	if _, err := s.Apply(Context{Sender: admin}, &Update{Config: &k, Model: &m}); err != nil {
		t.Fatal(err)
	}
	now := uint64(1)
	for pc := 0; pc+1 < len(prog); pc += 2 {
		op, arg := prog[pc], prog[pc+1]
		before := *s
		step, nonce := s.Progress.Step, s.Nonce
		ctx := Context{Sender: client(arg).Signer, Now: now, Seed: uint64(pc)*0x9e3779b97f4a7c15 + uint64(arg)}
		var ix Instruction
		rewritesProgress := false
		switch op % 12 {
		case 0:
			ctx.Sender = admin
			ix = &SetPaused{Paused: arg%2 == 0}
		case 1:
			ctx.Sender = admin
			ix = &SetPaused{Paused: false}
		case 2:
			ix = &JoinRun{ID: client(arg)}
		case 3, 4, 5:
			now += uint64(arg % 32)
			ctx.Now = now
			ix = &Tick{}
		case 6, 7:
			w := Witness{Key: uint64(arg)}
			r := s.CurrentRound()
			if i, ok := s.ClientIndex(ctx.Sender); ok && arg < 200 {
				w.Proof = s.Config.WitnessProofFor(r, i)
			} else {
				w.Proof = WitnessProof{Index: uint16(arg) * 3, Position: uint16(arg), IsWitness: arg%2 == 1}
			}
			for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
				if (arg>>(i%8))&1 == 0 || arg < 128 {
					w.Participants.Add(w.Key, ParticipantMember(s.Epoch.Clients[i].ID.Signer))
				}
			}
			w.Metadata.Step = s.Progress.Step
			if s.RunState == Warmup {
				ix = &WarmupWitness{Report: w}
			} else {
				ix = &WitnessRound{Report: w}
			}
		case 8:
			target := client(arg >> 3)
			p := WitnessProof{Index: uint16(arg >> 3)}
			if i, ok := s.ClientIndex(target.Signer); ok {
				p = s.Config.HealthCheckProofFor(s.CurrentRound(), i)
			}
			ix = &HealthCheck{ID: target, Proof: p}
		case 9:
			var src CheckpointSource
			copy(src.URL[:], "file:///c")
			if arg%4 == 0 {
				ctx.Sender = admin
			}
			ix = &RecordCheckpoint{Source: src}
		case 10:
			ctx.Sender = admin
			ix = &Update{Progress: &Progress{Step: uint32(arg % 16), Epoch: s.Progress.Epoch}}
			rewritesProgress = true
		case 11:
			ctx.Sender = admin
			if arg%2 == 0 {
				ctx.Sender = client(arg).Signer
			}
			ix = &FreeCoordinator{}
		}
		res, err := s.Apply(ctx, ix)
		if err != nil {
			if *s != before {
				t.Fatalf("op %d (%s): failed with %v but changed the state", pc/2, ix.Name(), err)
			}
			if CodeOf(err) == 0 {
				t.Fatalf("op %d (%s): error without a code: %v", pc/2, ix.Name(), err)
			}
			continue
		}
		if res.Changed != (s.Nonce == nonce+1) || (!res.Changed && *s != before) {
			t.Fatalf("op %d (%s): changed=%v, nonce %d -> %d", pc/2, ix.Name(), res.Changed, nonce, s.Nonce)
		}
		if s.Progress.Step < step && !rewritesProgress {
			t.Fatalf("op %d (%s): step went back from %d to %d", pc/2, ix.Name(), step, s.Progress.Step)
		}
		checkNextRound(t, &before, s, ix, ctx.Now, res.Changed)
		checkInvariants(t, s, pc%32 == 0)
		visited[s.RunState] = true
	}
	checkInvariants(t, s, true)
	return visited
}

// checkNextRound checks the two predictions a state makes about the next
// instruction: a tick at now changes it exactly when DueAt says it is due,
// and a training round that starts right after a round of the same epoch is
// the one NextRound announced (its seed drawn a round earlier).
func checkNextRound(t *testing.T, before, after *Coordinator, ix Instruction, now uint64, changed bool) {
	t.Helper()
	if _, ok := ix.(*Tick); ok {
		at, due := before.DueAt(now)
		if changed != (due && at <= now) {
			t.Fatalf("tick at %d in %s: changed=%v, but DueAt said %d (due %v)", now, before.RunState, changed, at, due)
		}
	}
	pred, trainers, ok := before.NextRound()
	if !ok || after.RunState != RoundTrain || before.Progress.Epoch != after.Progress.Epoch || before.Epoch.FirstRound {
		return
	}
	if cur := after.CurrentRound(); cur.Height == pred.Height {
		if *cur != pred {
			t.Fatalf("round h%d started as %+v, NextRound said %+v", cur.Height, *cur, pred)
		}
		for i, k := range trainers {
			if after.Epoch.Clients[i].ID.Signer != k {
				t.Fatalf("round h%d: trainer %d differs from NextRound's", cur.Height, i)
			}
		}
	}
}

// TestRandomProgramsReachEveryState runs the fuzz driver on seeded random
// programs, so the invariants are checked in every state on every test run.
func TestRandomProgramsReachEveryState(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	var seen [numRunStates]bool
	for i := 0; i < 100; i++ {
		prog := make([]byte, 600)
		for j := range prog {
			prog[j] = byte(r.Uint32())
			if j%2 == 0 && r.IntN(3) > 0 { // mostly joins, ticks and witnesses
				prog[j] = []byte{2, 3, 6}[r.IntN(3)]
			}
		}
		for st, ok := range runProgram(t, prog) {
			seen[st] = seen[st] || ok
		}
	}
	for st := WaitingForMembers; st < numRunStates; st++ {
		if !seen[st] {
			t.Errorf("no program reached %s", st)
		}
	}
}

// checkInvariants checks capacities and, when roundTrip is set, that the
// state encodes and decodes to the same bytes (slow, so not after every step).
func checkInvariants(t *testing.T, s *Coordinator, roundTrip bool) {
	t.Helper()
	if s.Epoch.ClientsLen > MaxClients || s.PendingLen > MaxClients || s.Epoch.ExitedLen > MaxExitedClients {
		t.Fatalf("capacity exceeded: %s", s.Describe())
	}
	for i := range s.Epoch.Rounds {
		if s.Epoch.Rounds[i].WitnessesLen > MaxWitnesses {
			t.Fatalf("round slot %d has %d witnesses", i, s.Epoch.Rounds[i].WitnessesLen)
		}
		if w := s.Config.WitnessCount(s.Epoch.Rounds[i].ClientsLen); uint16(s.Epoch.Rounds[i].WitnessesLen) > w {
			t.Fatalf("round slot %d has %d witnesses for %d slots", i, s.Epoch.Rounds[i].WitnessesLen, w)
		}
	}
	switch s.RunState {
	case RoundTrain, RoundWitness:
		if s.CurrentRound().ClientsLen != s.Epoch.ClientsLen {
			t.Fatalf("round has %d clients, epoch lists %d", s.CurrentRound().ClientsLen, s.Epoch.ClientsLen)
		}
	}
	if !roundTrip {
		return
	}
	b := s.MarshalAccount()
	d, err := DecodeAccount(b)
	if err != nil {
		t.Fatalf("state does not decode: %v", err)
	}
	if !bytes.Equal(d.MarshalAccount(), b) {
		t.Fatal("encode(decode(x)) != x")
	}
}
