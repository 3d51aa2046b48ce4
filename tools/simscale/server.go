package simscale

import (
	"encoding/base64"
	"errors"
	"time"

	"github.com/psyche-go/psyche/chain/serverwire"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/localrun"
)

// server is the coordinator server (after chain/server): the real
// coordinator state, instructions applied as they arrive, ticks after
// every change and when a transition falls due, and an event stream per
// trainer that sends the whole account first and then what changed since
// the account it sent last (chain/server's deltas), keeping only the newest
// pending snapshot.
type server struct {
	s     *Sim
	host  int
	state *coordinator.Coordinator
	admin coordinator.Pubkey
	// published is the newest state, shared by every subscriber (the
	// machines never write a snapshot), and its account bytes.
	published     *coordinator.Coordinator
	publishedAcct []byte
	version       uint64
	subs          []*subscriber
	tickAt        time.Duration // the scheduled tick (-1: none)
	// lastStep is the step whose round last started (for the metrics).
	roundStarted map[uint32]bool
}

// subscriber is one trainer's event stream.
type subscriber struct {
	t           *trainer
	sending     bool
	pending     *coordinator.Coordinator // newer than what is on the wire
	pendingAcct []byte
	sent        []byte // the account the stream sent last (nil: none yet)
}

// snapshotBytes is one event of the stream: "data: " + base64 of the
// account + a blank line (chain/server's serveEvents).
var snapshotBytes = len("data: ") + base64.StdEncoding.EncodedLen(coordinator.AccountSize) + 2

// slowSubscriber is chain/server's DefaultSlowSubscriber: a stream whose
// event takes longer to write is dropped.
const slowSubscriber = 10 * time.Second

func newServer(s *Sim, h int) (*server, error) {
	sv := &server{s: s, host: h, admin: localrun.Keys{}.Admin().Public(), tickAt: -1, roundStarted: map[uint32]bool{}}
	run, err := s.run()
	if err != nil {
		return nil, err
	}
	// The admin's instructions, as localrun.Create sends them, applied
	// directly: the first makes the state, the others configure and start
	// the run.
	ixs, err := run.Instructions(sv.admin)
	if err != nil {
		return nil, err
	}
	if sv.state, err = coordinator.New(*ixs[0].(*coordinator.InitCoordinator)); err != nil {
		return nil, err
	}
	for _, ix := range ixs[1:] {
		if _, err := sv.state.Apply(coordinator.Context{Sender: sv.admin, Now: s.unixNow()}, ix); err != nil {
			return nil, err
		}
	}
	return sv, nil
}

// run is the simulated run (localrun's definition, as psyche localnet and
// the trainer's tests make theirs): one epoch of cfg.Rounds rounds of one
// sequence per trainer, with the timeouts of examples/llama-1b-run.toml (a
// round waits up to 120 s for its witnesses), and the model of that file
// (which only sets the learning rate schedule here: results have the
// configured size whatever the model says), starting from seed:1 and
// reading a token file it never opens.
func (s *Sim) run() (localrun.Run, error) {
	r := localrun.NewRun(runID, s.cfg.Trainers, 1, func(k *coordinator.Config, m *coordinator.Model) {
		k.WarmupTime, k.CooldownTime, k.MaxRoundTrainTime, k.RoundWitnessTime = 300, 300, 120, 3
		k.EpochTime, k.WaitingForMembersExtraTime, k.TotalSteps, k.MinClients = 1<<30, 2, uint32(s.cfg.Rounds), 1
		*m = coordinator.Model{Architecture: coordinator.ArchLlama, MaxSeqLen: 2048,
			VocabSize: 128256, DModel: 2048, NLayers: 16, NHeads: 32, NKVHeads: 8, IntermediateSize: 8192, RopeTheta: 500000, TiedHead: true,
			LR:        coordinator.LRSchedule{Kind: coordinator.LRCosine, BaseLR: 0.004, FinalLR: 0.0004, WarmupSteps: 10, DecaySteps: 190},
			Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, Quantize1Bit: true, CompressionTopK: 12, CompressionChunk: 64, CompressionDecay: 0.97, ClipGradNorm: 1}}
	})
	return r, r.UseFiles(localrun.Files{Tokens: "tokens", TokenSize: 4, Seed: 1})
}

// start opens every trainer's stream (each begins with the current state).
func (sv *server) start() {
	for _, t := range sv.s.trainers {
		sv.subs = append(sv.subs, &subscriber{t: t})
	}
	sv.publish()
}

// over says the simulation is done: the run has left its rounds.
func (sv *server) over() bool {
	st := sv.state.RunState
	return st == coordinator.Cooldown || st == coordinator.Finished
}

// instruction applies ix sent by sender when it arrives and reports
// whether it was accepted.
func (sv *server) instruction(sender coordinator.Pubkey, ix coordinator.Instruction) bool {
	ctx := coordinator.Context{Sender: sender, Now: sv.s.unixNow(), Seed: sv.s.rng.Uint64()}
	before := sv.state.RunState
	res, err := sv.state.Apply(ctx, ix)
	sv.s.met.instruction(sv, ix, before, err)
	if err != nil {
		return false
	}
	if res.Changed {
		sv.changed(before)
		sv.tick() // chain/server ticks after every change
	}
	return true
}

// tick ticks the run now and schedules the next one at DueAt.
func (sv *server) tick() {
	before := sv.state.RunState
	sv.s.met.beforeTick(sv)
	changed, err := sv.state.Tick(sv.s.unixNow(), sv.s.rng.Uint64())
	if err == nil && changed {
		sv.s.met.tick(sv)
		sv.changed(before)
	} else if err != nil && !errors.Is(err, coordinator.ErrNothingDue) && !errors.Is(err, coordinator.ErrHalted) {
		panic("simscale: tick: " + err.Error())
	}
	sv.scheduleTick()
}

// scheduleTick arms the tick at the run's next due time (whole seconds).
func (sv *server) scheduleTick() {
	at, ok := sv.state.DueAt(sv.s.unixNow())
	if !ok {
		return
	}
	when := time.Duration(at-unixBase) * time.Second
	if when <= sv.s.sched.now {
		when = sv.s.sched.now
	}
	if sv.tickAt >= 0 && sv.tickAt <= when && sv.tickAt >= sv.s.sched.now {
		return // an earlier tick is already armed; it re-arms
	}
	sv.tickAt = when
	sv.s.sched.at(when, func() {
		if sv.tickAt != when {
			return // replaced by another
		}
		sv.tickAt = -1
		sv.tick()
	})
}

// changed records a new state and streams it.
func (sv *server) changed(before coordinator.RunState) {
	st := sv.state
	if st.RunState == coordinator.RoundTrain && !sv.roundStarted[st.Progress.Step] {
		sv.roundStarted[st.Progress.Step] = true
		sv.s.met.roundStart(st.Progress.Step, sv.s.sched.now, sv.s.net.hosts)
	}
	sv.publish()
	sv.scheduleTick()
}

// publish hands the current state to every stream.
func (sv *server) publish() {
	c := *sv.state
	sv.published, sv.publishedAcct = &c, c.MarshalAccount()
	sv.version++
	for _, sub := range sv.subs {
		sub.pending, sub.pendingAcct = sv.published, sv.publishedAcct
		sv.send(sub)
	}
}

// send writes the subscriber's pending snapshot if its stream is idle.
func (sv *server) send(sub *subscriber) {
	if sub.sending || sub.pending == nil {
		return
	}
	snap, acct := sub.pending, sub.pendingAcct
	sub.pending, sub.pendingAcct = nil, nil
	sub.sending = true
	began := sv.s.sched.now
	sv.s.met.snapshots++
	size := snapshotBytes
	if sub.sent != nil {
		if d := serverwire.DeltaEvent(sub.sent, acct); d != nil {
			size = len(d)
		}
	}
	sub.sent = acct
	sv.s.net.transfer(sv.host, sub.t.host, size, func() {
		sub.sending = false
		if sv.s.sched.now-began > slowSubscriber {
			sv.s.met.slowStreams++
		}
		sv.send(sub)
	}, func() { sub.t.snapshot(snap) })
}
