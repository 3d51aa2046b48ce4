package coordinator_test

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	coord "github.com/psyche-go/psyche/coordinator"
)

var (
	randomSeeds = flag.Int("random-seeds", 24, "number of seeded random sequences in TestRandomSequences")
	randomSteps = flag.Int("random-steps", 500, "instructions per random sequence")
	randomBase  = flag.Uint64("random-base", 0, "first seed of TestRandomSequences (to explore beyond the default seeds)")
)

// randomConfig returns a config that is valid most of the time.
func randomConfig(rng *rand.Rand) coord.Config {
	k := testConfig()
	k.MinClients = uint16(1 + rng.IntN(4))
	k.InitMinClients = k.MinClients + uint16(rng.IntN(3))
	k.WitnessNodes = uint16(rng.IntN(int(k.MinClients) + 1))
	k.GlobalBatchSizeStart = uint16(1 + rng.IntN(8))
	k.GlobalBatchSizeEnd = max(k.GlobalBatchSizeStart, k.InitMinClients) + uint16(rng.IntN(8))
	k.GlobalBatchSizeWarmupTokens = uint64(rng.IntN(3)) * 64
	if rng.IntN(4) == 0 { // long ramps, up to the 2^47 limit
		k.GlobalBatchSizeWarmupTokens = rng.Uint64() >> (17 + rng.IntN(40))
	}
	k.TotalSteps = uint32(3 + rng.IntN(25))
	k.WarmupTime = uint64(rng.IntN(15))
	k.CooldownTime = uint64(1 + rng.IntN(10))
	k.MaxRoundTrainTime = uint64(1 + rng.IntN(20))
	k.RoundWitnessTime = uint64(1 + rng.IntN(6))
	k.EpochTime = uint64(25 + rng.IntN(80))
	k.WaitingForMembersExtraTime = uint64(1 + rng.IntN(4))
	if rng.IntN(8) == 0 { // break one rule
		switch rng.IntN(6) {
		case 0:
			k.EpochTime = 0
		case 1:
			k.WitnessNodes = k.MinClients + 1
		case 2:
			k.VerificationPercent = uint8(1 + rng.IntN(100))
		case 3:
			k.MinClients = 0
		case 4:
			k.GlobalBatchSizeWarmupTokens = 1<<47 + uint64(rng.IntN(2))
		default:
			k.InitMinClients = 300
		}
	}
	return k
}

func randomModel(rng *rand.Rand) coord.Model {
	m := testModel()
	if rng.IntN(2) == 0 {
		m.Checkpoint.Kind = coord.CheckpointHub
	}
	if rng.IntN(3) == 0 {
		m.Optimizer = coord.Optimizer{Kind: coord.OptimizerAdamW, Beta1: 0.9, Beta2: 0.95, Epsilon: 1e-8, WeightDecay: 0.1}
	}
	m.Optimizer.Aggregation = coord.Aggregation(rng.IntN(3)) // AdamW ignores it, whatever it holds
	m.Optimizer.Normalization = coord.Normalization(rng.IntN(2))
	if rng.IntN(3) == 0 {
		m.Architecture = coord.ArchLlama
		m.NKVHeads, m.IntermediateSize, m.RopeTheta, m.TiedHead = uint32(1+rng.IntN(2)*3)%5, 96, 10000, rng.IntN(2) == 0
	} else if rng.IntN(4) == 0 {
		m.Architecture = coord.ArchTransformers
	}
	m.LR.Kind = coord.LRScheduleKind(1 + rng.IntN(4))
	m.LR.WarmupSteps, m.LR.DecaySteps, m.LR.TotalSteps = uint32(rng.IntN(10)), uint32(rng.IntN(10)), uint32(rng.IntN(20))
	switch rng.IntN(4) { // tokens = data_index × max_seq_len, up to overflowing 64 bits
	case 0:
		m.MaxSeqLen = 1 << 20
	case 1:
		m.MaxSeqLen = 0xffffffff
	}
	if rng.IntN(6) == 0 { // break one rule
		switch rng.IntN(13) {
		case 0:
			m.Checkpoint.Kind = coord.CheckpointKind(rng.IntN(8))
		case 1:
			m.NHeads = 3
		case 2:
			m.TokenSize = 2
			m.VocabSize = 70000
		case 3:
			m.Optimizer.Beta1 = 1
			m.Optimizer.Kind = coord.OptimizerAdamW
		case 4:
			m.LR.BaseLR = float32(rng.NormFloat64())
		case 5:
			m.Checkpoint.Source.Revision[5] = 'x' // text after the zero padding
		case 6:
			m.Optimizer.Aggregation = coord.Aggregation(3 + rng.IntN(253)) // unknown to both
		case 7:
			m.Architecture = coord.ArchLlama
			m.NKVHeads, m.IntermediateSize, m.RopeTheta = 3, 96, 10000 // 3 does not divide 4 heads
		case 8:
			// rope_theta at and around the rule's edges: 1 and below, NaN,
			// infinities, negatives, the smallest float above 1 (valid)
			m.Architecture = coord.ArchLlama
			m.NKVHeads, m.IntermediateSize = 4, 96
			m.RopeTheta = []float32{1, 0.5, 0, float32(math.NaN()), float32(math.Inf(1)), -10000, math.Nextafter32(1, 2), math.MaxFloat32}[rng.IntN(8)]
		case 9:
			// a GPT or Transformers model with a Llama field set
			m.Architecture = []coord.Architecture{coord.ArchGPT, coord.ArchTransformers}[rng.IntN(2)]
			switch rng.IntN(4) {
			case 0:
				m.NKVHeads = 4
			case 1:
				m.IntermediateSize = 1
			case 2:
				m.RopeTheta = float32(math.Copysign(0, -1))
			default:
				m.TiedHead = true
			}
		case 10:
			m.Architecture = coord.ArchLlama
			m.DModel, m.NHeads, m.NKVHeads, m.IntermediateSize, m.RopeTheta = 12, 4, 2, 8, 10000 // head size 3: odd
			if rng.IntN(2) == 0 {
				m.IntermediateSize = 0
			}
		case 11:
			m.Optimizer.Normalization = coord.Normalization(2 + rng.IntN(254)) // unknown to both
		default:
			m.Optimizer.CompressionTopK = 65
		}
	}
	return m
}

// TestRandomSequences drives seeded random instruction sequences (mostly
// well-formed and plausible, some invalid: wrong senders, wrong proofs, bad
// configs, corrupted bytes) through both implementations and compares them
// after every instruction.
func TestRandomSequences(t *testing.T) {
	buildHarness(t) // skips without a C compiler
	total := map[string]int{}
	var states [8]bool
	for seed := 0; seed < *randomSeeds; seed++ {
		t.Run(fmt.Sprint("seed", *randomBase+uint64(seed)), func(t *testing.T) {
			w := runRandom(t, *randomBase+uint64(seed), *randomSteps)
			for k, v := range w.seen {
				total[k] += v
			}
			for i, ok := range w.states {
				states[i] = states[i] || ok
			}
		})
	}
	if t.Failed() {
		return
	}
	// The sequences must reach the interesting outcomes, or they test little.
	for _, want := range []string{"init_coordinator ok", "update ok", "set_paused ok", "join_run ok", "tick ok",
		"warmup_witness ok", "witness ok", "health_check ok", "health_check 6060 ClientHealthy", "checkpoint ok",
		"free_coordinator ok", "witness 6050 InvalidProof", "join_run 6040 PendingFull", "update 6030 InvalidConfig",
		"update 6031 InvalidModel", "checkpoint 6070 NotCheckpointer", "witness 6052 DuplicateWitness"} {
		if total[want] == 0 {
			t.Errorf("no random sequence produced %q", want)
		}
	}
	for st := coord.WaitingForMembers; st <= coord.Paused; st++ {
		if !states[st] {
			t.Errorf("no random sequence reached %s", st)
		}
	}
	var keys []string
	for k := range total {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-45s %d\n", k, total[k])
	}
	t.Logf("outcomes over %d sequences:\n%s", *randomSeeds, b.String())
}

func runRandom(t *testing.T, seed uint64, steps int) *world {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	w := newWorld(t)
	admin := key("admin")
	var joinAuth coord.Pubkey
	if rng.IntN(3) == 0 {
		joinAuth = key("join-authority")
	}
	var runID [coord.MaxRunIDLen]byte
	copy(runID[:], fmt.Sprint("rand-", seed))
	nClients := 3 + rng.IntN(10)
	pick := func() coord.ClientID { return clientID(rng.IntN(nClients)) }
	start := func() { // a new run on a blank account
		w.acct = make([]byte, coord.AccountSize)
		w.do(0, &coord.InitCoordinator{MainAuthority: admin, JoinAuthority: joinAuth, RunID: runID}, ctxOf(admin))
		k, m := randomConfig(rng), randomModel(rng)
		if err := k.Validate(); err != nil {
			k = testConfig()
		}
		if err := m.Validate(); err != nil {
			m = testModel()
		}
		k.TotalSteps += uint32(rng.IntN(40))
		w.do(0, &coord.Update{Config: &k, Model: &m}, ctxOf(admin))
		w.do(0, &coord.SetPaused{Paused: false}, ctxOf(admin))
	}
	start()

	// Each state prefers the instructions that can do something in it (op
	// ranges of the switch below).
	preferred := map[coord.RunState][2]int{
		coord.WaitingForMembers: {30, 45}, coord.Warmup: {45, 70}, coord.RoundTrain: {45, 78},
		coord.RoundWitness: {70, 78}, coord.Cooldown: {78, 84}, coord.Paused: {84, 95}, coord.Uninitialized: {84, 95},
	}
	for i := 0; i < steps; i++ {
		s := w.state()
		if s.RunState == coord.Finished && rng.IntN(8) == 0 {
			start()
			continue
		}
		ctx := coord.Context{Sender: pick().Signer, Now: w.now, Seed: rng.Uint64()}
		if rng.IntN(4) == 0 {
			ctx.CoSigner = joinAuth
		}
		op := rng.IntN(100)
		if p, ok := preferred[s.RunState]; ok && rng.IntN(2) == 0 {
			op = p[0] + rng.IntN(p[1]-p[0])
		}
		var ix coord.Instruction
		switch {
		case op < 30:
			w.now += uint64(rng.IntN(12))
			if rng.IntN(10) == 0 {
				w.now += uint64(rng.IntN(200))
			}
			ctx.Now = w.now
			ix = &coord.Tick{}
		case op < 45:
			id := pick()
			if rng.IntN(10) > 0 {
				ctx.Sender = id.Signer
			}
			if rng.IntN(20) == 0 {
				id.P2P = pick().P2P
			}
			ix = &coord.JoinRun{ID: id}
		case op < 70:
			// a witness report, mostly from a real client with its real proof
			r := s.CurrentRound()
			var rep coord.Witness
			if s.Epoch.ClientsLen > 0 {
				i := uint16(rng.IntN(int(s.Epoch.ClientsLen)))
				skip := map[uint16]bool{}
				for j := uint16(0); j < s.Epoch.ClientsLen; j++ {
					skip[j] = rng.IntN(4) == 0
				}
				rep = witnessReport(s, i, rng.Uint64(), skip)
				ctx.Sender = s.Epoch.Clients[i].ID.Signer
				switch rng.IntN(12) {
				case 0:
					rep.Proof.Position = uint16(rng.IntN(int(r.ClientsLen) + 2))
				case 1:
					rep.Proof.IsWitness = !rep.Proof.IsWitness
				case 2:
					rep.Proof.Index = uint16(rng.IntN(300))
				case 3:
					rep.Metadata.Step += uint32(rng.IntN(3)) - 1
				case 4:
					ctx.Sender = key("outsider")
				}
			}
			if s.RunState == coord.Warmup || (rng.IntN(8) == 0) {
				ix = &coord.WarmupWitness{Report: rep}
			} else {
				ix = &coord.WitnessRound{Report: rep}
			}
		case op < 78:
			var hc coord.HealthCheck
			if s.Epoch.ClientsLen > 0 {
				i := uint16(rng.IntN(int(s.Epoch.ClientsLen)))
				hc.ID = s.Epoch.Clients[i].ID
				hc.Proof = s.Config.HealthCheckProofFor(s.CurrentRound(), i)
				ctx.Sender = s.Epoch.Clients[rng.IntN(int(s.Epoch.ClientsLen))].ID.Signer
				switch rng.IntN(10) {
				case 0:
					hc.Proof.Position ^= uint16(1 + rng.IntN(3))
				case 1:
					hc.ID.P2P = key("other")
				case 2:
					hc.Proof.Index = uint16(rng.IntN(300))
				}
			} else {
				hc.ID = pick()
			}
			ix = &hc
		case op < 84:
			var src coord.CheckpointSource
			copy(src.URL[:], fmt.Sprint("file:///ckpt/", i))
			switch rng.IntN(12) {
			case 0:
				src.URL[0] = 0
			case 1:
				src.Revision[7] = 'r'
			}
			switch {
			case rng.IntN(4) == 0:
				ctx.Sender = admin
			case s.Epoch.ClientsLen > 0:
				ctx.Sender = s.Epoch.Clients[rng.IntN(int(s.Epoch.ClientsLen))].ID.Signer
			}
			ix = &coord.RecordCheckpoint{Source: src}
		case op < 90:
			if rng.IntN(8) > 0 {
				ctx.Sender = admin
			}
			ix = &coord.SetPaused{Paused: rng.IntN(2) == 0}
		case op < 95:
			if rng.IntN(8) > 0 {
				ctx.Sender = admin
			}
			u := &coord.Update{}
			if rng.IntN(2) == 0 {
				md := coord.Metadata{NumParameters: rng.Uint64()}
				copy(md.Name[:], fmt.Sprint("name ", i))
				u.Metadata = &md
			}
			if rng.IntN(2) == 0 {
				k := randomConfig(rng)
				u.Config = &k
			}
			if rng.IntN(3) == 0 {
				m := randomModel(rng)
				u.Model = &m
			}
			if rng.IntN(4) == 0 {
				u.Progress = &coord.Progress{Epoch: s.Progress.Epoch, Step: uint32(rng.IntN(30)), EpochStartDataIndex: uint64(rng.IntN(500))}
				if rng.IntN(3) == 0 {
					u.Progress.EpochStartDataIndex = rng.Uint64() >> rng.IntN(64)
				}
			}
			ix = u
		case op < 97:
			if rng.IntN(2) == 0 {
				ctx.Sender = admin
			}
			ix = &coord.FreeCoordinator{}
		default:
			ix = &coord.InitCoordinator{MainAuthority: admin, RunID: runID}
		}
		data := coord.EncodeInstruction(ix)
		if rng.IntN(25) == 0 { // corrupt the bytes
			switch rng.IntN(3) {
			case 0:
				data = data[:rng.IntN(len(data)+1)]
			case 1:
				data[rng.IntN(len(data))] ^= byte(1 + rng.IntN(255))
			default:
				data = append(data, byte(rng.IntN(256)))
			}
		}
		w.apply(fmt.Sprintf("%s in %s", ix.Name(), s.RunState), data, ctx)
	}
	return w
}
