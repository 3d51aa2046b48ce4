package machine

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/internal/transcript"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the transcripts in testdata/ with the actual output")

// TestTranscripts replays every testdata/*.txt transcript: the machine of
// one trainer ("me") against a real (pure) coordinator whose other clients
// the harness plays. A transcript is a list of blocks:
//
//	command key=value ...
//	----
//	expected output
//	(blank line)
//
// Lines starting with # between blocks are comments. Run with -rewrite to
// regenerate the expected output, then review the diff.
func TestTranscripts(t *testing.T) {
	transcript.RunDir(t, *rewrite, func(t *testing.T) func(a *transcript.Args) string {
		h := &harness{t: t, names: map[coordinator.Pubkey]string{}, p2pNames: map[coordinator.Pubkey]string{}, frames: map[*distro.Frame]string{}}
		return h.run
	})
}

// harness holds the coordinator, the machine under test ("me") and what
// the last Ready asked for. Client name n has signer sha256("signer:"+n) and
// p2p key sha256("p2p:"+n); its result for a step has the commitment
// sha256("result:"+n+":"+step), so every party agrees on it.
type harness struct {
	t        *testing.T
	s        *coordinator.Coordinator
	now      uint64
	me       string
	m        *Machine
	last     Ready
	train    *TrainWork // the training to publish that a Ready asked for, until trained
	names    map[coordinator.Pubkey]string
	p2pNames map[coordinator.Pubkey]string // the same names by p2p key
	frames   map[*distro.Frame]string      // whose result a frame is
}

func idOf(name string) coordinator.ClientID {
	return coordinator.ClientID{Signer: sha256.Sum256([]byte("signer:" + name)), P2P: sha256.Sum256([]byte("p2p:" + name))}
}

func commitmentOf(name string, step uint32) coordinator.Hash {
	return sha256.Sum256([]byte(fmt.Sprintf("result:%s:%d", name, step)))
}

// versionOf is the commitment of name's result at step in version v: "" or
// "1" is the one every party agrees on, any other is a second result an
// equivocating trainer signs for the same batch.
func versionOf(name string, step uint32, v string) coordinator.Hash {
	if v == "" || v == "1" {
		return commitmentOf(name, step)
	}
	return sha256.Sum256([]byte(fmt.Sprintf("result:%s:%d:v%s", name, step, v)))
}

// nameVersion splits "c/2" (c's result in version 2) into name and version.
func nameVersion(s string) (string, string) {
	n, v, _ := strings.Cut(s, "/")
	return n, v
}

func names(kv *transcript.Args, key string) []string {
	if kv.Get(key) == "" {
		return nil
	}
	return strings.Split(kv.Get(key), ",")
}

// run executes one command and describes what happened.
//
// Commands (the machine's events are snapshot, loaded, trained, announce,
// fetched, pulled and machine-tick; each prints the Ready it returned):
//
//	run clients=a,b,c me=a [epochs=0] [ticking=false] [batch=6] [epoch-time=100] [train-time=10] [witness-nodes=0] [min=2]
//	    [ckpt=hub|p2p] [checkpoint-wait=0] [init-min=len(clients)]
//	    creates, configures and resumes a run; me is the machine's client
//	join who=b,c                     others join
//	tick [n=1]                       the coordinator's clock moves n seconds, ticking each
//	snapshot                         the machine sees the coordinator's state
//	deliver                          the last Ready's instructions, sent as me
//	loaded                           the load the last Ready asked for is done
//	load-failed why=not-yet|no-holder|unreadable-here   the load the last Ready asked for did not
//	                                 give the model (LoadFailure), now
//	trained [loss=2.5]               the batch a Ready asked for is trained and published (other
//	                                 events may come between; a batch trained ahead answers
//	                                 nothing: the driver keeps it)
//	sat-out                          the batch a Ready asked for was not trained: its data did
//	                                 not come (nothing is published)
//	announce who=b [step=S] [v=2]    b's result for step S (default: the current one) is announced;
//	                                 v names another version of it (b equivocates)
//	fetched who=b [step=S] [v=2] [err=timeout|invalid]   b's result arrived, or its fetch failed
//	pulled who=b,c/2 [step=S]        a pull answered with their announcements (c/2: c's version 2)
//	notice who=b [step=S] [batch-of=c]   b's training notice for its batch of step S (default: the
//	                                 current one), or for c's batch (a notice from the wrong trainer)
//	machine-tick                     the machine's one-second tick, at the coordinator's time
//	due-tick                         the check for a due transition between those (WithTicking)
//	time [n=1]                       the clock moves n seconds and nobody ticks (a Solana run)
//	tick-sent                        the tick the last Ready asked for is sent as me, and lands
//	witness who=b,c [saw=a,b,c/2]    others report the current round, having seen saw's results
//	                                 (c/2: c's version 2)
//	checkpoint who=b                 b records the epoch's checkpoint
//	pause, resume                    the run's authority pauses or resumes it
//	update-model [d-model=N]         the run's authority changes the model (a paused run's)
//	state                            the coordinator, described
func (h *harness) run(kv *transcript.Args) string {
	cmd := kv.Cmd
	switch cmd {
	case "run":
		return h.newRun(kv)
	case "join":
		var out []string
		for _, n := range names(kv, "who") {
			out = append(out, n+": "+h.apply(n, &coordinator.JoinRun{ID: idOf(n)}))
		}
		return strings.Join(out, "\n") + "\n" + h.s.Describe()
	case "tick":
		for i := uint64(0); i < kv.Uint(h.t, "n", 1); i++ {
			h.now++
			// A second in which nothing is due is what a backend's ticker
			// skips; only other refusals are the transcript's business.
			if _, err := h.s.Tick(h.now, h.now*31); err != nil && !errors.Is(err, coordinator.ErrNothingDue) {
				return "tick: " + err.Error()
			}
		}
		return h.s.Describe()
	case "state":
		return h.s.Describe()
	case "update-model":
		admin := sha256.Sum256([]byte("admin"))
		m := h.s.Model
		m.DModel = uint32(kv.Uint(h.t, "d-model", uint64(m.DModel)))
		if _, err := h.s.Apply(coordinator.Context{Sender: admin, Now: h.now}, &coordinator.Update{Model: &m}); err != nil {
			return cmd + ": " + err.Error()
		}
		return h.s.Describe()
	case "pause", "resume":
		admin := sha256.Sum256([]byte("admin"))
		if _, err := h.s.Apply(coordinator.Context{Sender: admin, Now: h.now}, &coordinator.SetPaused{Paused: cmd == "pause"}); err != nil {
			return cmd + ": " + err.Error()
		}
		return h.s.Describe()
	case "snapshot":
		c := *h.s
		return h.ready(h.m.Snapshot(&c, h.now))
	case "deliver":
		var out []string
		for _, ix := range h.last.Send {
			out = append(out, h.describeIx(ix)+": "+h.apply(h.me, ix))
		}
		h.last.Send = nil
		if len(out) == 0 {
			return "nothing to send"
		}
		return strings.Join(out, "\n") + "\n" + h.s.Describe()
	case "loaded":
		if h.last.Load == nil {
			h.t.Fatalf("loaded: the last Ready asked for no load")
		}
		return h.ready(h.m.Loaded(h.last.Load.Epoch))
	case "load-failed":
		l := h.last.Load
		if l == nil {
			h.t.Fatalf("load-failed: the last Ready asked for no load")
		}
		why := map[string]LoadFailure{"not-yet": LoadNotYet, "no-holder": LoadNoHolder, "unreadable-here": LoadUnreadableHere}
		f, ok := why[kv.Get("why")]
		if !ok {
			h.t.Fatalf("load-failed: why=%q", kv.Get("why"))
		}
		return h.ready(h.m.LoadFailed(l.Epoch, l.Source, f, h.now))
	case "trained":
		w := h.train
		if w == nil {
			h.t.Fatalf("trained: no Ready asked for a training to publish")
		}
		h.train = nil
		loss, err := strconv.ParseFloat(kv.Get("loss"), 32)
		if err != nil {
			loss = 2.5
		}
		return h.ready(h.m.Trained(h.announcement(h.me, w.Step, w.Batch), h.frame(h.me, w.Step), TrainStats{Loss: float32(loss)}))
	case "sat-out":
		w := h.train
		if w == nil {
			h.t.Fatalf("sat-out: no Ready asked for a training to publish")
		}
		h.train = nil
		return h.ready(h.m.SatOut(w.Step))
	case "announce":
		who := kv.Get("who")
		step := uint32(kv.Uint(h.t, "step", uint64(h.s.Progress.Step)))
		a := h.announcement(who, step, h.batchOf(who, step))
		a.Commitment = versionOf(who, step, kv.Get("v"))
		return h.ready(h.m.Announced(a))
	case "fetched":
		who := kv.Get("who")
		step := uint32(kv.Uint(h.t, "step", uint64(h.s.Progress.Step)))
		a := h.announcement(who, step, h.batchOf(who, step))
		a.Commitment = versionOf(who, step, kv.Get("v"))
		switch kv.Get("err") {
		case "":
			label := who
			if v := kv.Get("v"); v != "" && v != "1" {
				label += "/" + v
			}
			return h.ready(h.m.Fetched(a, h.frame(label, step), nil, false))
		case "timeout":
			return h.ready(h.m.Fetched(a, nil, errors.New("timeout"), false))
		case "invalid":
			return h.ready(h.m.Fetched(a, nil, errors.New("not a frame"), true))
		}
		h.t.Fatalf("fetched: err=%q", kv.Get("err"))
	case "pulled":
		step := uint32(kv.Uint(h.t, "step", uint64(h.s.Progress.Step)))
		var list []p2p.Announcement
		for _, nv := range names(kv, "who") {
			n, v := nameVersion(nv)
			a := h.announcement(n, step, h.batchOf(n, step))
			a.Commitment = versionOf(n, step, v)
			list = append(list, a)
		}
		return h.ready(h.m.Pulled(list))
	case "notice":
		who := kv.Get("who")
		step := uint32(kv.Uint(h.t, "step", uint64(h.s.Progress.Step)))
		of := who
		if o := kv.Get("batch-of"); o != "" {
			of = o
		}
		return h.ready(h.m.Noticed(p2p.Notice{RunID: "transcript", Step: step, Batch: h.batchOf(of, step), Trainer: idOf(who)}))
	case "machine-tick":
		return h.ready(h.m.Tick(h.now))
	case "due-tick":
		return h.ready(h.m.TickDue(h.now))
	case "time":
		h.now += kv.Uint(h.t, "n", 1)
		return fmt.Sprintf("now=%d", h.now)
	case "tick-sent":
		out := "tick: " + h.apply(h.me, &coordinator.Tick{})
		h.m.TickSent()
		return out + "\n" + h.s.Describe()
	case "witness":
		return h.witness(names(kv, "who"), names(kv, "saw"))
	case "checkpoint":
		var src coordinator.CheckpointSource
		_ = coordinator.SetFixedString(src.URL[:], "file:///ckpt")
		return kv.Get("who") + ": " + h.apply(kv.Get("who"), &coordinator.RecordCheckpoint{Source: src}) + "\n" + h.s.Describe()
	}
	h.t.Fatalf("unknown command %q", cmd)
	return ""
}

func (h *harness) newRun(kv *transcript.Args) string {
	h.me = kv.Get("me")
	admin := sha256.Sum256([]byte("admin"))
	id, _ := coordinator.ParseRunID("transcript")
	s, err := coordinator.New(coordinator.InitCoordinator{MainAuthority: admin, RunID: id})
	if err != nil {
		h.t.Fatal(err)
	}
	h.s = s
	for _, n := range names(kv, "clients") {
		h.names[idOf(n).Signer] = n
		h.p2pNames[idOf(n).P2P] = n
	}
	batch := uint16(kv.Uint(h.t, "batch", 6))
	cfg := coordinator.Config{WarmupTime: 5, CooldownTime: 5, MaxRoundTrainTime: kv.Uint(h.t, "train-time", 10), RoundWitnessTime: 2,
		EpochTime: kv.Uint(h.t, "epoch-time", 100), WaitingForMembersExtraTime: 1, TotalSteps: 100,
		GlobalBatchSizeStart: batch, GlobalBatchSizeEnd: batch, InitMinClients: uint16(kv.Uint(h.t, "init-min", uint64(len(names(kv, "clients"))))),
		MinClients: uint16(kv.Uint(h.t, "min", 2)), WitnessNodes: uint16(kv.Uint(h.t, "witness-nodes", 0))}
	m := coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2, MaxSeqLen: 8,
		VocabSize: 256, DModel: 8, NLayers: 1, NHeads: 1, LR: coordinator.LRSchedule{Kind: coordinator.LRConstant, BaseLR: 0.5},
		Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.9, CompressionTopK: 2, CompressionChunk: 8}}
	m.Checkpoint.Kind = coordinator.CheckpointHub
	if kv.Get("ckpt") == "p2p" {
		m.Checkpoint.Kind = coordinator.CheckpointP2P
	}
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "file:///init")
	_ = coordinator.SetFixedString(m.DataLocation[:], "data")
	for _, ix := range []coordinator.Instruction{&coordinator.Update{Config: &cfg, Model: &m}, &coordinator.SetPaused{}} {
		if _, err := h.s.Apply(coordinator.Context{Sender: admin, Now: h.now}, ix); err != nil {
			h.t.Fatalf("run: %s: %v", ix.Name(), err)
		}
	}
	k := uint64(0)
	h.m = New(idOf(h.me), int(kv.Uint(h.t, "epochs", 0)), kv.Get("ticking") == "true", func() uint64 { k++; return k })
	h.m.CheckpointWait(kv.Uint(h.t, "checkpoint-wait", 0))
	return h.s.Describe()
}

// apply sends ix as name's client; the seed follows the clock.
func (h *harness) apply(name string, ix coordinator.Instruction) string {
	if _, err := h.s.Apply(coordinator.Context{Sender: idOf(name).Signer, Now: h.now, Seed: h.now*31 + 7}, ix); err != nil {
		var e *coordinator.Error
		if errors.As(err, &e) {
			return "error " + e.Name
		}
		return "error " + err.Error()
	}
	return "ok"
}

// batchOf is the batch the coordinator gave name at step (of this epoch).
func (h *harness) batchOf(name string, step uint32) p2p.BatchRange {
	r := h.s.RoundAtHeight(step - h.s.Epoch.StartStep)
	if r == nil || step < h.s.Epoch.StartStep {
		h.t.Fatalf("step %d is not a round the coordinator holds", step)
	}
	i, ok := h.s.ClientIndex(idOf(name).Signer)
	ranges := h.s.RoundAssignment(r)
	if !ok || int(i) >= len(ranges) {
		h.t.Fatalf("%s has no batch at step %d", name, step)
	}
	return p2p.BatchRange{Start: ranges[i].Start, End: ranges[i].Start + ranges[i].Count}
}

func (h *harness) announcement(name string, step uint32, b p2p.BatchRange) p2p.Announcement {
	return p2p.Announcement{RunID: "transcript", Step: step, Batch: b, Trainer: idOf(name), Commitment: commitmentOf(name, step)}
}

// frame is a stand-in for name's result at step, remembered by identity.
func (h *harness) frame(name string, step uint32) *distro.Frame {
	f := distinctFrame(uint32(len(h.frames)))
	h.frames[f] = fmt.Sprintf("%s@%d", name, step)
	return f
}

// witness sends the current round's report of each named client that is an
// elected witness: saw's results (default: every trainer of the round).
func (h *harness) witness(who, saw []string) string {
	r := h.s.CurrentRound()
	if saw == nil {
		for i := uint16(0); i < r.ClientsLen; i++ {
			saw = append(saw, h.names[h.s.Epoch.Clients[i].ID.Signer])
		}
	}
	var out []string
	for _, n := range who {
		i, ok := h.s.ClientIndex(idOf(n).Signer)
		if !ok {
			out = append(out, n+": not a client")
			continue
		}
		proof := h.s.Config.WitnessProofFor(r, i)
		if !proof.IsWitness {
			out = append(out, n+": not a witness")
			continue
		}
		w := coordinator.Witness{Proof: proof, Key: uint64(i) + 1000}
		w.Metadata.Step = h.s.Progress.Step
		for _, sv := range saw {
			s, v := nameVersion(sv)
			w.Participants.Add(w.Key, coordinator.ParticipantMember(idOf(s).Signer))
			w.Broadcasts.Add(w.Key, versionOf(s, h.s.Progress.Step, v))
		}
		var ix coordinator.Instruction = &coordinator.WitnessRound{Report: w}
		if h.s.RunState == coordinator.Warmup {
			ix = &coordinator.WarmupWitness{Report: w}
		}
		out = append(out, n+": "+h.apply(n, ix))
	}
	return strings.Join(out, "\n") + "\n" + h.s.Describe()
}

// ready describes a Ready, one line per field that asks for something, in
// field order, and keeps it for deliver, loaded and trained.
func (h *harness) ready(rd Ready) string {
	h.last = rd
	if rd.Train != nil && !rd.Train.Ahead {
		h.train = rd.Train
	}
	var out []string
	if a := rd.Apply; a != nil {
		var fs []string
		for _, f := range a.Frames {
			fs = append(fs, h.frames[f])
		}
		sort.Strings(fs)
		out = append(out, fmt.Sprintf("apply step=%d lr=%g frames=[%s] missing=%v", a.Step, a.LR, strings.Join(fs, " "), a.Missing))
	}
	if l := rd.Load; l != nil {
		out = append(out, fmt.Sprintf("load epoch=%d from=%s", l.Epoch, l.Source))
	}
	if w := rd.Train; w != nil {
		flag := ""
		switch {
		case w.Ahead:
			flag = " ahead"
		case w.Reuse:
			flag = " reuse"
		}
		out = append(out, fmt.Sprintf("train step=%d batch=[%d,%d) lr=%g%s", w.Step, w.Batch.Start, w.Batch.End, w.LR, flag))
	}
	for _, ix := range rd.Send {
		out = append(out, "send "+h.describeIx(ix))
	}
	for _, a := range rd.Fetch {
		out = append(out, fmt.Sprintf("fetch %s@%d[%d,%d)", h.names[a.Trainer.Signer], a.Step, a.Batch.Start, a.Batch.End))
	}
	if rd.Pull != nil {
		out = append(out, fmt.Sprintf("pull step=%d", *rd.Pull))
	}
	if rd.Share != nil {
		out = append(out, fmt.Sprintf("share epoch=%d", *rd.Share))
	}
	if rd.Save != nil {
		out = append(out, fmt.Sprintf("save epoch=%d step=%d", rd.Save.Epoch, rd.Save.Step))
	}
	if rd.Tick {
		out = append(out, "tick")
	}
	if rd.Done != "" {
		out = append(out, "done: "+rd.Done)
	}
	for _, k := range rd.Report {
		out = append(out, "report "+h.p2pNames[k])
	}
	if len(out) == 0 {
		return "(nothing)"
	}
	return strings.Join(out, "\n")
}

// describeIx names an instruction with what identifies it.
func (h *harness) describeIx(ix coordinator.Instruction) string {
	switch ix := ix.(type) {
	case *coordinator.WitnessRound:
		return fmt.Sprintf("witness step=%d saw=%s", ix.Report.Metadata.Step, h.seen(&ix.Report))
	case *coordinator.WarmupWitness:
		return "warmup_witness"
	case *coordinator.HealthCheck:
		return "health_check " + h.names[ix.ID.Signer]
	}
	return ix.Name()
}

// seen lists the clients in a report's participant bloom.
func (h *harness) seen(w *coordinator.Witness) string {
	var out []string
	for k, n := range h.names {
		if w.Participants.Has(w.Key, coordinator.ParticipantMember(k)) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// distinctFrame is a stand-in result whose fingerprint is n's alone, so
// that no two stand-ins look like copies of each other.
func distinctFrame(n uint32) *distro.Frame {
	return &distro.Frame{Tensors: []distro.Tensor{{Shape: []int{1}, Indices: []uint32{n}}}}
}
