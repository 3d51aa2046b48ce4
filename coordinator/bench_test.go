package coordinator

import (
	"errors"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/internal/transcript"
)

// fullEpoch returns a harness in RoundTrain of round h1 of an epoch with 256
// clients and 32 witnesses, whose round h0 was witnessed by all 32 witnesses
// with every client but c7 in their participant blooms.
func fullEpoch(tb testing.TB) *harness {
	h := newHarness()
	names := make([]string, MaxClients)
	for i := range names {
		names[i] = "c" + itoa(uint64(i))
	}
	for _, cmd := range []string{
		"init run=bench",
		"config init_min_clients=256 min_clients=200 witness_nodes=32 batch_start=512 batch_end=512",
		"resume t=0",
		"join " + strings.Join(names, " ") + " t=1",
		"run until=2",
		"warmup-witness witnesses t=3",
		"witness witnesses t=4 missing=c7",
		"run until=9",
	} {
		h.run(tb, cmd)
	}
	if h.c.RunState != RoundTrain || h.c.CurrentRound().Height != 1 || h.c.PreviousRound().WitnessesLen != MaxWitnesses {
		tb.Fatalf("setup: %s", h.c.Describe())
	}
	return h
}

func BenchmarkTick(b *testing.B) {
	h := fullEpoch(b)
	now := h.c.RunStateStart // steady path: no timeout has passed
	b.ReportAllocs()
	for b.Loop() {
		// Nothing is due: refused as NothingDue, the state untouched.
		if changed, err := h.c.Tick(now, 1); changed || !errors.Is(err, ErrNothingDue) {
			b.Fatalf("a tick with nothing due: changed %v, %v", changed, err)
		}
	}
}

func TestTickDoesNotAllocate(t *testing.T) {
	h := fullEpoch(t)
	for _, st := range []RunState{WaitingForMembers, Warmup, RoundTrain, RoundWitness, Cooldown} {
		c := *h.c
		c.RunState = st
		now := c.RunStateStart
		if n := testing.AllocsPerRun(100, func() { _, _ = c.Tick(now, 1) }); n != 0 {
			t.Errorf("%s: tick allocates %.0f times", st, n)
		}
	}
	// A tick that starts a round does not allocate either.
	c := *h.c
	c.RunState = RoundWitness
	now := c.RunStateStart + c.Config.RoundWitnessTime
	if n := testing.AllocsPerRun(1, func() { _, _ = c.Tick(now, 1) }); n != 0 {
		t.Errorf("round transition allocates %.0f times", n)
	}
}

// BenchmarkWitness measures a witness instruction on a 256-client round:
// proof verification (a 90-round swap-or-not) plus duplicate checks and the
// copy of the two blooms into the round.
func BenchmarkWitness(b *testing.B) {
	h := fullEpoch(b)
	r := h.c.CurrentRound()
	names := h.expand([]string{"witnesses"})
	last := names[len(names)-1]
	ix := &WitnessRound{Report: h.report(b, transcript.ParseArgs("witness"), last)}
	ctx := Context{Sender: h.key(last), Now: h.c.RunStateStart}
	b.ReportAllocs()
	for b.Loop() {
		r.WitnessesLen = 0
		if _, err := h.c.Apply(ctx, ix); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHealthCheck drops a client that none of the 32 witnesses of the
// previous round saw: two proof shuffles and 32 bloom lookups.
func BenchmarkHealthCheck(b *testing.B) {
	h := fullEpoch(b)
	i, _ := h.c.ClientIndex(h.key("c7"))
	ix := &HealthCheck{ID: h.id("c7"), Proof: h.c.Config.HealthCheckProofFor(h.c.CurrentRound(), i)}
	ctx := Context{Sender: h.key("c0"), Now: h.c.RunStateStart}
	b.ReportAllocs()
	for b.Loop() {
		h.c.Epoch.Clients[i].State = Healthy
		if _, err := h.c.Apply(ctx, ix); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSwapOrNot256(b *testing.B) {
	key := ShuffleKey(42, SaltWitness)
	for b.Loop() {
		SwapOrNot(200, 256, key)
	}
}

func BenchmarkAssignData256(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		AssignData(42, 0, 4096, 256)
	}
}

func BenchmarkMarshalAccount(b *testing.B) {
	h := fullEpoch(b)
	buf := make([]byte, AccountSize)
	b.SetBytes(int64(AccountSize))
	b.ReportAllocs()
	for b.Loop() {
		if err := h.c.EncodeAccount(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeAccount(b *testing.B) {
	h := fullEpoch(b)
	buf := h.c.MarshalAccount()
	var s Coordinator
	b.SetBytes(int64(AccountSize))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.DecodeAccountInto(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func TestPendingListIsCappedAt256(t *testing.T) {
	h := fullEpoch(t) // batch_end is 512, so only the 256 cap applies
	for i := 0; i < MaxClients; i++ {
		h.run(t, "join p"+itoa(uint64(i)))
	}
	if h.c.PendingLen != MaxClients {
		t.Fatalf("%d pending", h.c.PendingLen)
	}
	if got := h.run(t, "join one-too-many"); !strings.Contains(got, "PendingFull") {
		t.Fatalf("257th join: %s", got)
	}
}
