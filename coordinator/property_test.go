package coordinator

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/quick"
)

func TestSwapOrNotIsAPermutation(t *testing.T) {
	for n := uint64(1); n <= 300; n++ {
		key := ShuffleKey(n*7919, SaltWitness)
		seen := make([]bool, n)
		for i := uint64(0); i < n; i++ {
			p := SwapOrNot(i, n, key)
			if p >= n || seen[p] {
				t.Fatalf("n=%d: index %d maps to %d (out of range or repeated)", n, i, p)
			}
			seen[p] = true
		}
	}
}

// shuffleListReference applies the swap-or-not rounds to a whole list at once,
// written as directly from the description as possible: in round r every
// pair (i, flip(i)) is swapped when the bit chosen by max(i, flip) is set.
// A position of the list is "where index i ends up".
func shuffleListReference(n uint64, key Hash) []uint64 {
	pos := make([]uint64, n) // pos[i] = current position of original index i
	for i := range pos {
		pos[i] = uint64(i)
	}
	for r := 0; r < shuffleRounds; r++ {
		ph := sha256.Sum256(append(key[:], byte(r)))
		pivot := binary.LittleEndian.Uint64(ph[:8]) % n
		for i := range pos {
			x := pos[i]
			flip := (pivot + n - x) % n
			p := max(x, flip)
			var le [4]byte
			binary.LittleEndian.PutUint32(le[:], uint32(p/256))
			src := sha256.Sum256(append(append(key[:], byte(r)), le[:]...))
			if src[(p%256)/8]>>(p%8)&1 == 1 {
				pos[i] = flip
			}
		}
	}
	return pos
}

func TestSwapOrNotMatchesReference(t *testing.T) {
	check := func(seed uint64, n8 uint8) bool {
		n := uint64(n8) + 1
		key := ShuffleKey(seed, SaltCommittee)
		ref := shuffleListReference(n, key)
		for i := uint64(0); i < n; i++ {
			if SwapOrNot(i, n, key) != ref[i] {
				return false
			}
		}
		return true
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 50}); err != nil {
		t.Fatal(err)
	}
}

func TestSaltsGiveDifferentShuffles(t *testing.T) {
	same := 0
	for i := uint64(0); i < 256; i++ {
		if SwapOrNot(i, 256, ShuffleKey(1, SaltCommittee)) == SwapOrNot(i, 256, ShuffleKey(1, SaltWitness)) {
			same++
		}
	}
	if same > 16 {
		t.Fatalf("committee and witness shuffles agree on %d of 256 positions", same)
	}
}

func TestQuorum(t *testing.T) {
	for _, tc := range []struct{ w, q uint16 }{{0, 1}, {1, 1}, {2, 2}, {3, 2}, {4, 2}, {5, 3}, {6, 4}, {9, 6}, {32, 21}} {
		if got := Quorum(tc.w); got != tc.q {
			t.Errorf("Quorum(%d) = %d, want %d", tc.w, got, tc.q)
		}
	}
}

func TestWitnessCount(t *testing.T) {
	for _, tc := range []struct{ nodes, clients, want uint16 }{
		{0, 3, 3}, {0, 40, 32}, {0, 256, 32}, {2, 3, 2}, {5, 3, 3}, {0, 0, 0},
	} {
		k := Config{WitnessNodes: tc.nodes}
		if got := k.WitnessCount(tc.clients); got != tc.want {
			t.Errorf("WitnessCount(nodes=%d, clients=%d) = %d, want %d", tc.nodes, tc.clients, got, tc.want)
		}
	}
}

func TestAssignDataCoversTheBatchExactlyOnce(t *testing.T) {
	for _, tc := range []struct {
		n     int
		batch uint16
	}{{1, 1}, {1, 7}, {3, 6}, {3, 7}, {3, 8}, {5, 3}, {256, 256}, {256, 1000}, {17, 65535}} {
		for seed := uint64(0); seed < 5; seed++ {
			ranges := AssignData(seed, 1000, tc.batch, tc.n)
			covered := make([]int, tc.batch)
			for _, d := range ranges {
				if d.Count > uint64(tc.batch)/uint64(tc.n)+1 {
					t.Fatalf("n=%d B=%d: a trainer got %d indices", tc.n, tc.batch, d.Count)
				}
				for i := d.Start; i < d.Start+d.Count; i++ {
					covered[i-1000]++
				}
			}
			for i, c := range covered {
				if c != 1 {
					t.Fatalf("n=%d B=%d seed=%d: index %d assigned %d times", tc.n, tc.batch, seed, 1000+i, c)
				}
			}
		}
	}
}

func TestAssignDataDependsOnSeed(t *testing.T) {
	a, b := AssignData(1, 0, 8, 8), AssignData(2, 0, 8, 8)
	if len(a) != 8 || a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] {
		t.Fatalf("assignments do not depend on the seed: %v %v", a, b)
	}
}

func TestBatchSizeRamp(t *testing.T) {
	k := Config{GlobalBatchSizeStart: 10, GlobalBatchSizeEnd: 20, GlobalBatchSizeWarmupTokens: 1000}
	for _, tc := range []struct {
		idx  uint64
		want uint16
	}{{0, 10}, {10, 11}, {50, 15}, {99, 19}, {100, 20}, {1 << 40, 20}, {math.MaxUint64, 20}} {
		if got := k.BatchSize(10, tc.idx); got != tc.want {
			t.Errorf("BatchSize(idx=%d) = %d, want %d", tc.idx, got, tc.want)
		}
	}
	flat := Config{GlobalBatchSizeStart: 5, GlobalBatchSizeEnd: 5}
	if flat.BatchSize(10, 0) != 5 {
		t.Error("no ramp: want the end size")
	}
}

// TestDataIndexForStepMatchesTheRun drives a run and checks each round's data
// index against the closed-form helper.
func TestDataIndexForStepMatchesTheRun(t *testing.T) {
	h := newHarness()
	for _, cmd := range []string{"init run=idx", "config epoch_time=25", "resume t=0", "join alice bob carol t=1", "run until=2",
		"warmup-witness witnesses t=3"} {
		h.run(t, cmd)
	}
	checked := 0
	for now := uint64(4); now < 200 && h.c.RunState != Finished; now++ {
		if h.c.RunState == RoundTrain {
			r := h.c.CurrentRound()
			if want := h.c.Config.DataIndexForStep(h.c.Model.MaxSeqLen, h.c.Progress.Step); r.DataIndex != want {
				t.Fatalf("step %d: round data index %d, DataIndexForStep %d", h.c.Progress.Step, r.DataIndex, want)
			}
			checked++
			h.run(t, "witness witnesses t="+itoa(now))
		}
		if h.c.RunState == WaitingForMembers && h.c.PendingLen == 0 {
			h.run(t, "join alice bob carol t="+itoa(now))
		}
		if h.c.RunState == Warmup {
			h.run(t, "warmup-witness witnesses t="+itoa(now))
		}
		_, _ = h.c.Tick(now, now)
		h.now = now
	}
	if checked < 10 || h.c.Progress.Epoch < 2 {
		t.Fatalf("only %d rounds over %d epochs", checked, h.c.Progress.Epoch)
	}
}

func itoa(n uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

func members(prefix string, n int) []Hash {
	out := make([]Hash, n)
	for i := range out {
		out[i] = sha256.Sum256([]byte(prefix + itoa(uint64(i))))
	}
	return out
}

func TestBloomFalsePositives(t *testing.T) {
	in := members("member", 256)
	out := members("stranger", 100000)
	var a, b Bloom
	const keyA, keyB = 0x1234, 0x9876
	for _, m := range in {
		a.Add(keyA, m)
		b.Add(keyB, m)
	}
	for _, m := range in {
		if !a.Has(keyA, m) || !b.Has(keyB, m) {
			t.Fatal("false negative")
		}
	}
	fpA, fpB, both := 0, 0, 0
	for _, m := range out {
		ha, hb := a.Has(keyA, m), b.Has(keyB, m)
		if ha {
			fpA++
		}
		if hb {
			fpB++
		}
		if ha && hb {
			both++
		}
	}
	rateA, rateB := float64(fpA)/float64(len(out)), float64(fpB)/float64(len(out))
	t.Logf("false positives: %.3f%% and %.3f%%, both %d (independent: %.1f expected)",
		100*rateA, 100*rateB, both, rateA*rateB*float64(len(out)))
	if rateA > 0.01 || rateB > 0.01 {
		t.Fatalf("false-positive rates %.4f and %.4f exceed 1%%", rateA, rateB)
	}
	// Independent keys: the joint rate is the product of the two (about 6 in
	// 100000 here). With a shared key every false positive would be joint.
	if expect := rateA * rateB * float64(len(out)); float64(both) > 4*expect+8 {
		t.Fatalf("%d joint false positives, %.1f expected if independent", both, expect)
	}
	var c Bloom
	for _, m := range in {
		c.Add(keyA, m)
	}
	shared := 0
	for _, m := range out {
		if a.Has(keyA, m) && c.Has(keyA, m) {
			shared++
		}
	}
	if shared != fpA {
		t.Fatalf("same key: %d joint of %d false positives; the check above would be vacuous", shared, fpA)
	}
}

func TestBloomBitLayout(t *testing.T) {
	// The library stores bit i in word i/64 at bit i%64; our account stores the
	// words in order, little-endian. Setting one element sets exactly k bits.
	var b Bloom
	b.Add(7, Hash{1})
	if got := b.Count(); got < 1 || got > BloomHashes {
		t.Fatalf("%d bits set", got)
	}
}

func TestConsensusCommitment(t *testing.T) {
	k := Config{WitnessNodes: 3}
	honest, forged := Hash{1}, Hash{2}
	mk := func(votes ...Hash) *Round {
		r := &Round{ClientsLen: 3}
		for i, v := range votes {
			w := &r.Witnesses[i]
			w.Key = uint64(i + 1)
			if v != (Hash{}) {
				w.Broadcasts.Add(w.Key, v)
			}
			r.WitnessesLen++
		}
		return r
	}
	for _, tc := range []struct {
		name  string
		r     *Round
		cands []Hash
		want  Hash
		ok    bool
	}{
		{"unanimous", mk(honest, honest, honest), []Hash{honest}, honest, true},
		{"quorum", mk(honest, honest, Hash{}), []Hash{forged, honest}, honest, true},
		{"no quorum", mk(honest, forged, Hash{}), []Hash{honest, forged}, Hash{}, false},
		{"unseen", mk(honest, honest), []Hash{forged}, Hash{}, false},
	} {
		got, ok := k.ConsensusCommitment(tc.r, tc.cands)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: got %x %v", tc.name, got[:2], ok)
		}
	}
}

func TestConfigRules(t *testing.T) {
	base := tinyConfig()
	if err := base.Validate(); err != nil {
		t.Fatalf("tiny config invalid: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		rule string
	}{
		{"epoch", func(k *Config) { k.EpochTime = 0 }, "epoch_time must be greater"},
		{"warmup", func(k *Config) { k.WarmupTime = k.EpochTime }, "warmup_time"},
		{"train0", func(k *Config) { k.MaxRoundTrainTime = 0 }, "max_round_train_time must be greater"},
		{"train", func(k *Config) { k.MaxRoundTrainTime = k.EpochTime }, "max_round_train_time (100)"},
		{"witness time", func(k *Config) { k.RoundWitnessTime = 0 }, "round_witness_time"},
		{"cooldown", func(k *Config) { k.CooldownTime = 0 }, "cooldown_time"},
		{"extra", func(k *Config) { k.WaitingForMembersExtraTime = 0 }, "waiting_for_members_extra_time"},
		{"min0", func(k *Config) { k.MinClients = 0; k.WitnessNodes = 0 }, "min_clients must be greater"},
		{"min>init", func(k *Config) { k.MinClients = 4 }, "must not exceed init_min_clients"},
		{"init>256", func(k *Config) { k.InitMinClients = 257; k.GlobalBatchSizeEnd = 300 }, "must not exceed 256"},
		{"batch0", func(k *Config) { k.GlobalBatchSizeStart = 0 }, "global_batch_size_start must be greater"},
		{"batch order", func(k *Config) { k.GlobalBatchSizeStart = 13 }, "must not exceed global_batch_size_end"},
		{"batch<clients", func(k *Config) { k.GlobalBatchSizeStart, k.GlobalBatchSizeEnd = 2, 2 }, "every trainer needs a sequence"},
		{"tokens", func(k *Config) { k.GlobalBatchSizeWarmupTokens = 1<<47 + 1 }, "2^47"},
		{"steps", func(k *Config) { k.TotalSteps = 0 }, "total_steps"},
		{"witnesses", func(k *Config) { k.WitnessNodes = 3 }, "witness_nodes"},
		{"verification", func(k *Config) { k.VerificationPercent = 101 }, "verification_percent"},
	} {
		k := base
		tc.edit(&k)
		err := k.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.rule) {
			t.Errorf("%s: got %v, want a violation of %q", tc.name, err, tc.rule)
		}
		if n := strings.Count(err.Error(), "invalid config"); n != 1 && tc.name != "epoch" {
			t.Errorf("%s: %d violations reported, want exactly 1: %v", tc.name, n, err)
		}
	}
}

func TestModelRules(t *testing.T) {
	base := tinyModel()
	if err := base.Validate(); err != nil {
		t.Fatalf("tiny model invalid: %v", err)
	}
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name string
		edit func(*Model)
		rule string
	}{
		{"arch", func(m *Model) { m.Architecture = 9 }, "architecture"},
		{"seq", func(m *Model) { m.MaxSeqLen = 0 }, "max_seq_len"},
		{"heads", func(m *Model) { m.NHeads = 5 }, "n_heads"},
		{"ephemeral", func(m *Model) { m.Checkpoint.Kind = CheckpointEphemeral }, "ephemeral"},
		{"no checkpoint", func(m *Model) { m.Checkpoint.Kind = CheckpointNone }, "checkpoint source is required"},
		{"url", func(m *Model) { m.Checkpoint.Source.URL = [URLLen]byte{} }, "checkpoint URL"},
		{"url garbage", func(m *Model) { m.Checkpoint.Source.URL[100] = 'x' }, "padded with zeros"},
		{"data", func(m *Model) { m.DataKind = 7 }, "data kind"},
		{"token size", func(m *Model) { m.TokenSize = 3 }, "token_size"},
		{"vocab", func(m *Model) { m.VocabSize = 70000 }, "2-byte tokens"},
		{"lr nan", func(m *Model) { m.LR.BaseLR = nan }, "base_lr"},
		{"lr negative", func(m *Model) { m.LR.BaseLR = -1 }, "base_lr"},
		{"wsd", func(m *Model) {
			m.LR = LRSchedule{Kind: LRWarmupStableDecay, BaseLR: 1, WarmupSteps: 5, DecaySteps: 6, TotalSteps: 10}
		}, "decay_steps"},
		{"decay", func(m *Model) { m.Optimizer.CompressionDecay = 1 }, "compression_decay"},
		{"topk", func(m *Model) { m.Optimizer.CompressionTopK = 65 }, "compression_topk"},
		{"aggregation", func(m *Model) { m.Optimizer.Aggregation = numAggregations }, "aggregation 3 is unknown"},
		{"normalization", func(m *Model) { m.Optimizer.Normalization = numNormalizations }, "normalization 2 is unknown"},
		{"adamw", func(m *Model) { m.Optimizer.Kind = OptimizerAdamW; m.Optimizer.Beta1 = 0.9; m.Optimizer.Beta2 = 0.95 }, "epsilon"},
		{"gpt kv heads", func(m *Model) { m.NKVHeads = 4 }, "Llama fields"},
		{"gpt tied", func(m *Model) { m.TiedHead = true }, "Llama fields"},
		{"llama kv heads", func(m *Model) { *m = tinyLlama(); m.NKVHeads = 3 }, "n_kv_heads (3)"},
		{"llama no kv heads", func(m *Model) { *m = tinyLlama(); m.NKVHeads = 0 }, "n_kv_heads (0)"},
		{"llama odd head", func(m *Model) { *m = tinyLlama(); m.DModel, m.NHeads, m.NKVHeads = 36, 4, 2 }, "must be even"},
		{"llama intermediate", func(m *Model) { *m = tinyLlama(); m.IntermediateSize = 0 }, "intermediate_size"},
		{"llama theta 1", func(m *Model) { *m = tinyLlama(); m.RopeTheta = 1 }, "rope_theta"},
		{"llama theta nan", func(m *Model) { *m = tinyLlama(); m.RopeTheta = nan }, "rope_theta"},
		{"llama theta inf", func(m *Model) { *m = tinyLlama(); m.RopeTheta = float32(math.Inf(1)) }, "rope_theta"},
	} {
		m := base
		tc.edit(&m)
		err := m.Validate()
		if !errors.Is(err, ErrInvalidModel) || !strings.Contains(err.Error(), tc.rule) {
			t.Errorf("%s: got %v, want a violation of %q", tc.name, err, tc.rule)
		}
	}
	for _, tied := range []bool{false, true} {
		m := tinyLlama()
		m.TiedHead = tied
		if err := m.Validate(); err != nil {
			t.Errorf("tied=%v: %v", tied, err)
		}
	}
}

// tinyLlama is tinyModel with the Llama architecture: grouped-query
// attention (4 query heads over 2 key/value heads).
func tinyLlama() Model {
	m := tinyModel()
	m.Architecture = ArchLlama
	m.NKVHeads, m.IntermediateSize, m.RopeTheta = 2, 96, 10000
	return m
}

// TestEveryClientTrains: verification_percent samples trainers for the
// witnesses' scores; it makes no verifier committee.
func TestEveryClientTrains(t *testing.T) {
	for _, pct := range []uint8{0, 10, 100} {
		k := Config{VerificationPercent: pct}
		for _, pos := range []uint64{0, 5, 200} {
			if c, err := k.CommitteeOf(pos); err != nil || c != TrainerCommittee {
				t.Fatalf("verification_percent %d, position %d: got %v %v", pct, pos, c, err)
			}
		}
	}
}

func TestCheckpointerElection(t *testing.T) {
	for _, n := range []uint16{1, 2, 3, 4, 10, 256} {
		s := &Coordinator{}
		s.Epoch.ClientsLen = n
		s.Epoch.Rounds[0].RandomSeed = uint64(n)
		elected := 0
		for i := uint16(0); i < n+3; i++ {
			if s.IsCheckpointer(i) {
				elected++
			}
		}
		if want := int((n + 2) / 3); elected != want {
			t.Errorf("n=%d: %d checkpointers, want %d", n, elected, want)
		}
	}
}

func TestCheckpointHolders(t *testing.T) {
	id := func(n byte, key byte) ClientID { return ClientID{Signer: Pubkey{n}, P2P: Pubkey{key}} }
	for _, tc := range []struct {
		name    string
		clients []Client
		exited  []Client
		want    []ClientID
	}{
		{"new run", []Client{{ID: id(1, 1)}}, nil, nil},
		{"returning and new", []Client{{ID: id(1, 1)}, {ID: id(2, 2)}, {ID: id(3, 3)}},
			[]Client{{ID: id(3, 3)}, {ID: id(1, 1), State: Withdrawn}}, []ClientID{id(1, 1), id(3, 3)}},
		{"a restart with a new p2p key holds nothing", []Client{{ID: id(1, 9)}}, []Client{{ID: id(1, 1)}}, nil},
		{"a dropped holder no longer serves", []Client{{ID: id(1, 1), State: Dropped}, {ID: id(2, 2)}},
			[]Client{{ID: id(1, 1)}, {ID: id(2, 2)}}, []ClientID{id(2, 2)}},
	} {
		s := &Coordinator{}
		s.Epoch.ClientsLen = uint16(copy(s.Epoch.Clients[:], tc.clients))
		s.Epoch.ExitedLen = uint16(copy(s.Epoch.Exited[:], tc.exited))
		if got := s.CheckpointHolders(); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
