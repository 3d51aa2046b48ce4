package coordinator

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/internal/transcript"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the transcripts in testdata/ with the actual output")

// TestTranscripts replays every testdata/*.txt transcript. A transcript is a
// list of blocks:
//
//	command arg key=value ...
//	----
//	expected output
//	(blank line)
//
// Lines starting with # between blocks are comments. Run with -rewrite to
// regenerate the expected output, then review the diff.
func TestTranscripts(t *testing.T) {
	transcript.RunDir(t, *rewrite, func(t *testing.T) func(a *transcript.Args) string {
		h := newHarness()
		return func(a *transcript.Args) string { return h.exec(t, a) }
	})
}

// harness drives one coordinator with named participants. A name's signer
// key is sha256("signer:"+name) and its p2p key sha256("p2p:"+name).
type harness struct {
	c     *Coordinator
	now   uint64
	names map[Pubkey]string
}

func newHarness() *harness { return &harness{c: new(Coordinator), names: map[Pubkey]string{}} }

func (h *harness) key(name string) Pubkey {
	k := Pubkey(sha256.Sum256([]byte("signer:" + name)))
	h.names[k] = name
	return k
}

func (h *harness) id(name string) ClientID {
	return ClientID{Signer: h.key(name), P2P: sha256.Sum256([]byte("p2p:" + name))}
}

func (h *harness) name(k Pubkey) string {
	if n, ok := h.names[k]; ok {
		return n
	}
	return fmt.Sprintf("%x", k[:4])
}

func (h *harness) ctx(t testing.TB, a *transcript.Args, sender string) Context {
	h.now = a.Uint(t, "t", h.now)
	c := Context{Sender: h.key(sender), Now: h.now, Seed: a.Uint(t, "seed", h.now)}
	if co := a.Get("cosign"); co != "" {
		c.CoSigner = h.key(co)
	}
	return c
}

func result(err error) string {
	if err == nil {
		return "ok"
	}
	var e *Error
	if errors.As(err, &e) {
		return "error " + e.Name + ": " + err.Error()
	}
	return "error: " + err.Error()
}

// tinyConfig is the config the transcripts start from: 3 clients, short timeouts.
func tinyConfig() Config {
	return Config{WarmupTime: 10, CooldownTime: 10, MaxRoundTrainTime: 20, RoundWitnessTime: 5, EpochTime: 100,
		WaitingForMembersExtraTime: 2, TotalSteps: 100, GlobalBatchSizeStart: 6, GlobalBatchSizeEnd: 12,
		GlobalBatchSizeWarmupTokens: 8 * 16, InitMinClients: 3, MinClients: 2, WitnessNodes: 2}
}

func tinyModel() Model {
	m := Model{Architecture: ArchGPT, DataKind: DataLocal, TokenSize: 2, MaxSeqLen: 8, VocabSize: 256,
		DModel: 32, NLayers: 2, NHeads: 4,
		LR:        LRSchedule{Kind: LRConstant, BaseLR: 0.001},
		Optimizer: Optimizer{Kind: OptimizerDistro, CompressionDecay: 0.999, CompressionTopK: 4, CompressionChunk: 8, Quantize1Bit: true}}
	m.Checkpoint.Kind = CheckpointHub
	_ = SetFixedString(m.Checkpoint.Source.URL[:], "file:///models/tiny")
	_ = SetFixedString(m.DataLocation[:], "data/tokens.bin")
	return m
}

func setConfigField(t testing.TB, k *Config, name, v string) {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("config %s=%q: %v", name, v, err)
	}
	fields := map[string]any{
		"warmup_time": &k.WarmupTime, "cooldown_time": &k.CooldownTime, "max_round_train_time": &k.MaxRoundTrainTime,
		"round_witness_time": &k.RoundWitnessTime, "epoch_time": &k.EpochTime,
		"waiting_for_members_extra_time": &k.WaitingForMembersExtraTime, "warmup_tokens": &k.GlobalBatchSizeWarmupTokens,
		"total_steps": &k.TotalSteps, "batch_start": &k.GlobalBatchSizeStart, "batch_end": &k.GlobalBatchSizeEnd,
		"init_min_clients": &k.InitMinClients, "min_clients": &k.MinClients, "witness_nodes": &k.WitnessNodes,
		"verification_percent": &k.VerificationPercent,
	}
	switch p := fields[name].(type) {
	case *uint64:
		*p = n
	case *uint32:
		*p = uint32(n)
	case *uint16:
		*p = uint16(n)
	case *uint8:
		*p = uint8(n)
	default:
		t.Fatalf("unknown config field %q", name)
	}
}

// names expands the positional arguments; "witnesses" stands for every healthy
// elected witness of the current round, in index order.
func (h *harness) expand(pos []string) []string {
	var out []string
	for _, p := range pos {
		if p != "witnesses" {
			out = append(out, p)
			continue
		}
		r := h.c.CurrentRound()
		for i := uint16(0); i < r.ClientsLen && i < h.c.Epoch.ClientsLen; i++ {
			cl := h.c.Epoch.Clients[i]
			if cl.State == Healthy && h.c.Config.WitnessProofFor(r, i).IsWitness {
				out = append(out, h.name(cl.ID.Signer))
			}
		}
	}
	return out
}

// report builds a witness report from name for the current round: every
// healthy listed client except those in missing is a participant.
func (h *harness) report(t testing.TB, a *transcript.Args, name string) Witness {
	r := h.c.CurrentRound()
	w := Witness{Key: uint64(len(name))*1000 + h.now}
	if i, ok := h.c.ClientIndex(h.key(name)); ok {
		w.Proof = h.c.Config.WitnessProofFor(r, i)
	}
	if p := a.Get("proof"); p != "" {
		parts := strings.Split(p, ":")
		idx, _ := strconv.Atoi(parts[0])
		pos, _ := strconv.Atoi(parts[1])
		w.Proof = WitnessProof{Index: uint16(idx), Position: uint16(pos), IsWitness: parts[2] == "1"}
	}
	missing := map[string]bool{}
	for _, m := range strings.Split(a.Get("missing"), ",") {
		missing[m] = true
	}
	for i := uint16(0); i < h.c.Epoch.ClientsLen; i++ {
		cl := h.c.Epoch.Clients[i]
		if !missing[h.name(cl.ID.Signer)] {
			w.Participants.Add(w.Key, ParticipantMember(cl.ID.Signer))
		}
	}
	w.Metadata.Step = uint32(a.Uint(t, "step", uint64(h.c.Progress.Step)))
	return w
}

// run runs one command line, failing on a key or word it does not read.
func (h *harness) run(t testing.TB, line string) string {
	a := transcript.ParseArgs(line)
	out := h.exec(t, a)
	if u := a.Unread(); len(u) > 0 {
		t.Fatalf("%s: unknown keys or words %q", line, u)
	}
	return out
}

func (h *harness) exec(t testing.TB, a *transcript.Args) string {
	cmd := a.Cmd
	var out strings.Builder
	say := func(prefix string, err error) {
		if prefix != "" {
			out.WriteString(prefix + ": ")
		}
		out.WriteString(result(err) + "\n")
	}
	apply := func(sender string, ix Instruction) error {
		before := h.c.MarshalAccount()
		_, err := h.c.Apply(h.ctx(t, a, sender), ix)
		if err != nil && string(before) != string(h.c.MarshalAccount()) {
			t.Fatalf("%s: failed instruction changed the state", cmd)
		}
		return err
	}
	switch cmd {
	case "init":
		// init run=ID [authority=NAME] [join-authority=NAME] [from=NAME]
		ix := &InitCoordinator{MainAuthority: h.key(a.GetOr("authority", "admin"))}
		ix.RunID, _ = ParseRunID(a.GetOr("run", "test"))
		copy(ix.RunID[:], a.Get("raw-run"))
		if ja := a.Get("join-authority"); ja != "" {
			ix.JoinAuthority = h.key(ja)
		}
		say("", apply(a.GetOr("from", "admin"), ix))
	case "config":
		// config [from=NAME] [field=value ...]: update config (and the tiny model if unset)
		k := tinyConfig()
		for _, key := range a.Keys() {
			if key != "t" && key != "from" {
				setConfigField(t, &k, key, a.Get(key))
			}
		}
		u := &Update{Config: &k}
		if !slices.Contains(a.Pos(), "no-model") {
			m := tinyModel()
			u.Model = &m
		}
		say("", apply(a.GetOr("from", "admin"), u))
	case "progress":
		// progress step=N epoch=N data=N
		p := Progress{Step: uint32(a.Uint(t, "step", 0)), Epoch: uint32(a.Uint(t, "epoch", 0)), EpochStartDataIndex: a.Uint(t, "data", 0)}
		say("", apply(a.GetOr("from", "admin"), &Update{Progress: &p}))
	case "metadata":
		var m Metadata
		_ = SetFixedString(m.Name[:], a.GetOr("name", "run"))
		say("", apply(a.GetOr("from", "admin"), &Update{Metadata: &m}))
	case "pause", "resume":
		say("", apply(a.GetOr("from", "admin"), &SetPaused{Paused: cmd == "pause"}))
	case "join":
		// join NAME... [p2p=NAME] [cosign=NAME] [as=NAME]
		for _, n := range a.Pos() {
			id := h.id(n)
			if p := a.Get("p2p"); p != "" {
				id.P2P = sha256.Sum256([]byte("p2p:" + p))
			}
			say(n, apply(a.GetOr("as", n), &JoinRun{ID: id}))
		}
	case "tick":
		say("", apply("anyone", &Tick{}))
	case "run":
		// run until=T: tick every second up to T, printing each change.
		until := a.Uint(t, "until", h.now)
		for h.now < until {
			h.now++
			changed, err := h.c.Tick(h.now, h.now)
			if errors.Is(err, ErrNothingDue) {
				continue // what a backend's ticker does: not yet
			}
			if err != nil {
				fmt.Fprintf(&out, "t=%d: %s\n", h.now, result(err))
				break
			}
			if changed {
				fmt.Fprintf(&out, "t=%d: %s\n", h.now, h.c.Describe())
			}
		}
		return out.String()
	case "warmup-witness", "witness":
		for _, n := range h.expand(a.Pos()) {
			w := h.report(t, a, n)
			var ix Instruction = &WitnessRound{Report: w}
			if cmd == "warmup-witness" {
				ix = &WarmupWitness{Report: w}
			}
			say(n, apply(n, ix))
		}
	case "health-check":
		// health-check FROM TARGET [index=N]
		from, target := a.Pos()[0], a.Pos()[1]
		r := h.c.CurrentRound()
		i, _ := h.c.ClientIndex(h.key(target))
		p := h.c.Config.HealthCheckProofFor(r, i)
		if v, ok := a.Lookup("index"); ok {
			n, _ := strconv.Atoi(v)
			p.Index = uint16(n)
		}
		say("", apply(from, &HealthCheck{ID: h.id(target), Proof: p}))
	case "checkpoint":
		// checkpoint NAME|elected [url=U]
		var src CheckpointSource
		_ = SetFixedString(src.URL[:], a.GetOr("url", "file:///ckpt/epoch"))
		for _, n := range a.Pos() {
			if n == "elected" {
				for i := uint16(0); i < h.c.Epoch.ClientsLen; i++ {
					if h.c.IsCheckpointer(i) {
						n = h.name(h.c.Epoch.Clients[i].ID.Signer)
						break
					}
				}
			}
			say(n, apply(n, &RecordCheckpoint{Source: src}))
		}
	case "free":
		say("", apply(a.GetOr("from", "admin"), &FreeCoordinator{}))
	case "clients":
		return h.c.DescribeClients(h.name)
	case "assign":
		r := h.c.CurrentRound()
		ranges := h.c.RoundAssignment(r)
		for i, d := range ranges {
			fmt.Fprintf(&out, "%s: [%d, %d)\n", h.name(h.c.Epoch.Clients[i].ID.Signer), d.Start, d.Start+d.Count)
		}
		return out.String()
	case "roles":
		r := h.c.CurrentRound()
		var lines []string
		for i := uint16(0); i < r.ClientsLen && i < h.c.Epoch.ClientsLen; i++ {
			p := h.c.Config.WitnessProofFor(r, i)
			role := "trainer"
			if p.IsWitness {
				role = "trainer+witness"
			}
			if h.c.RunState == Cooldown && h.c.IsCheckpointer(i) {
				role += "+checkpointer"
			}
			lines = append(lines, fmt.Sprintf("%s: witness-position=%d %s", h.name(h.c.Epoch.Clients[i].ID.Signer), p.Position, role))
		}
		sort.Strings(lines)
		return strings.Join(lines, "\n") + "\n"
	default:
		t.Fatalf("unknown command %q", cmd)
	}
	out.WriteString(h.c.Describe() + "\n")
	return out.String()
}
