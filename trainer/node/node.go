// Package node owns the trainer's client node: it follows a run's
// coordinator, joins every epoch, loads the model, trains its assigned batch
// each round, publishes the compressed result to its peers, fetches theirs,
// witnesses rounds when elected, applies each round's consensus results two
// rounds later, and records checkpoints when elected. It trains ahead: the
// coordinator fixes each round's seed a round early, so once this node has
// published round h and applied h-1 it computes its round h+1 gradient in the
// background while round h is witnessed, and publishes it the moment h+1
// starts as guessed (the same model either way: every node applies the same
// rounds in the same order, and a gradient trained ahead is dropped whenever
// the model changes or the round starts otherwise). At the end of an epoch
// it offers its model to the next epoch's joiners, and as a joiner it loads
// the model from them (P2P checkpoints) or from the run's file or http(s)
// source. On a backend nobody ticks (Solana), it ticks (WithTicking).
//
// The decisions live in trainer/node/machine, which does no I/O and reads
// no clock: each event returns a machine.Ready saying what to do. Node.Run
// is the driver: one goroutine that feeds it events and does each Ready
// through trainer/node/drive (field order, the queue of Readies the work
// answers with), whose effects are here (effects.go); it reads nothing of
// the machine but what Ready says (the copycat adversary's build alone
// asks it for the others' results, to copy them). The simulator in
// tools/simscale does its Readies through the same drive step.
package node

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/goengine"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/node/drive"
	"github.com/psyche-go/psyche/trainer/node/machine"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// Progress is what the node reports after each thing it does (for a progress
// display or metrics).
type Progress struct {
	State      coordinator.RunState
	Epoch      uint32
	Step       uint32
	TotalSteps uint32  // the run's (0 until the node has seen its config)
	Loss       float32 // loss of the last trained batch
	Tokens     uint64  // tokens trained by this node
	Sent       uint64  // result bytes published
	Received   uint64  // result bytes fetched
	Applied    uint64  // rounds applied
	Witnessed  uint64  // witness reports sent
	// Compute is the time spent training batches (forward, backward,
	// compression) and applying rounds: what the node would spend alone.
	// The rest of a round is coordination and networking.
	Compute time.Duration
	// Verify is the part of Compute spent scoring other trainers' results
	// (verification_percent), and Verified how many it scored.
	Verify   time.Duration
	Verified uint64
}

// Node is one trainer: the driver that does what its machine decides.
type Node struct {
	cfg config
	// lastProgress and epochStart are the progress last reported and at
	// the start of the epoch's rounds (Run's goroutine only).
	lastProgress, epochStart Progress
	runID                    string
	backend                  chain.Backend
	signer                   chain.Signer
	net                      p2p.Network
	m                        *machine.Machine
	// engineTimeout is the run's bound on one round's computation, from
	// the latest snapshot; preparing is the engine's preparation in
	// progress or done, closed when it ends (Run's goroutine only).
	engineTimeout time.Duration
	preparing     chan struct{}
	release       func() // undoes the preparation, once preparing is closed

	id coordinator.ClientID
	// eng computes for the node once a model is loaded, and plan is the
	// run's DisTrO plan for that model: the node checks and sizes peers'
	// frames with it and combines each round once, and the engine applies
	// the aggregate. engMu guards the fields (Model reads eng from other
	// goroutines), not the engine.
	engMu sync.Mutex
	eng   engine.Engine
	plan  *distro.Plan
	last  runmodel.Model // the model held when Run closed the engine
	// checkedModel says that checkModel accepted the run's Transformers
	// model.
	checkedModel bool
	fetches      fetchQueue
	// fetchCtx bounds the fetches in flight; dropFetches cancels it
	// (machine.Ready.DropFetches) and makes the next.
	fetchCtx    context.Context
	cancelFetch context.CancelFunc
	// sends carries instructions to the sender goroutine (Run starts it),
	// in the order the machine asked for them.
	sends chan outgoing
	// badPeers are the trainers whose bad results were logged as warnings.
	badPeers map[coordinator.Pubkey]bool
	data     *data.Provider
	dataLoc  string
	// sitOut is what the node knows of an epoch it sits out (the Run
	// loop's alone).
	sitOut sitOut
	// storeChecked is the run's checkpoint store this node last checked
	// (checkStore); the Run loop's alone.
	storeChecked coordinator.CheckpointStore
	// totalSteps is the run's, for Progress (written by the Run loop, read
	// by report from the same goroutine or a caller's).
	totalSteps atomic.Uint32
	// ahead is the gradient being trained ahead, or held, for the next
	// round (machine.TrainWork.Ahead); only the Run loop reads or replaces it.
	ahead *aheadRun
	// uploads are checkpoint uploads to the run's store in flight; Run
	// returns after them.
	uploads sync.WaitGroup
}

// New creates a node for a run over network (Start creates both).
func New(runID string, backend chain.Backend, signer chain.Signer, network p2p.Network, opts ...Option) (*Node, error) {
	cfg := config{log: slog.New(slog.DiscardHandler), workers: 2, clock: wallClock{}}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.kernels == nil {
		cfg.kernels = kernels.Default()
	}
	if cfg.precision != "" {
		cfg.kernels, _ = kernels.WithPrecision(cfg.kernels, cfg.precision)
	}
	if cfg.engine == nil {
		cfg.engine = goengine.New(cfg.kernels)
		logKernels(cfg.log, cfg.kernels, cfg.precision)
	}
	if cfg.metrics == nil {
		cfg.metrics = NewMetrics(nil)
	}
	if _, err := coordinator.ParseRunID(runID); err != nil {
		return nil, err
	}
	for _, a := range cfg.peers {
		if _, err := network.AddrKey(a); err != nil {
			return nil, fmt.Errorf("node: peer address: %w", err)
		}
	}
	id := coordinator.ClientID{Signer: signer.Public(), P2P: network.ID()}
	return &Node{cfg: cfg, runID: runID, badPeers: map[coordinator.Pubkey]bool{}, backend: backend, signer: signer, net: network, id: id,
		m: newMachine(id, cfg)}, nil
}

// newMachine is the machine that decides for the node of cfg.
func newMachine(id coordinator.ClientID, cfg config) *machine.Machine {
	m := machine.New(id, cfg.epochs, cfg.ticking, randomKey)
	m.JoinAfter(cfg.joinAfter)
	m.JoinFrom(cfg.joinFrom)
	// The machine counts whole seconds: a wait under one is one.
	m.CheckpointWait(uint64((cfg.checkpointWait + time.Second - 1) / time.Second))
	return m
}

// ID is the node's client identity.
func (n *Node) ID() coordinator.ClientID { return n.id }

// Model is a host model holding the node's current parameters (nil until
// one is loaded, or when the engine cannot give them). With the Go engine
// it is the model itself; other engines copy the parameters out, so call it
// between rounds or after Run.
func (n *Node) Model() runmodel.Model {
	n.engMu.Lock()
	e, last := n.eng, n.last
	n.engMu.Unlock()
	if e == nil {
		return last
	}
	m, err := n.hostModel(e)
	if err != nil {
		n.cfg.log.Warn("the engine cannot give its model", "engine", e.Name(), "err", err)
		return nil
	}
	return m
}

// hostModel is a model in this process holding e's current parameters:
// the Go engine's own model, or a copy read from e a tensor at a time (for
// tests and the reports of small runs, never on a trainer's path).
func (n *Node) hostModel(e engine.Engine) (runmodel.Model, error) {
	w, err := e.Weights()
	if err != nil {
		return nil, err
	}
	return runmodel.FromWeights(context.Background(), w, n.cfg.kernels)
}

// engine is the node's engine (nil until a model is loaded).
func (n *Node) engine() engine.Engine {
	e, _ := n.held()
	return e
}

// runPlan is the run's plan for the engine's model (nil until a model is
// loaded).
func (n *Node) runPlan() *distro.Plan {
	_, p := n.held()
	return p
}

// held is the engine and the plan of its model, read together.
func (n *Node) held() (engine.Engine, *distro.Plan) {
	n.engMu.Lock()
	defer n.engMu.Unlock()
	return n.eng, n.plan
}

// setEngine replaces the node's engine and the plan of its model, closing
// the engine it had.
func (n *Node) setEngine(e engine.Engine, p *distro.Plan) {
	n.engMu.Lock()
	old := n.eng
	n.eng, n.plan = e, p
	n.engMu.Unlock()
	if old != nil && old != e {
		if err := old.Close(); err != nil {
			n.cfg.log.Warn("closing the previous engine", "engine", old.Name(), "err", err)
		}
	}
}

// closeEngine keeps a host copy of the model the engine holds (what Model
// answers after Run; none WithoutFinalModel) and releases the engine: a worker process does not
// outlive the node's Run.
func (n *Node) closeEngine() {
	e := n.engine()
	if e == nil {
		return
	}
	var m runmodel.Model
	if !n.cfg.noFinal {
		var err error
		if m, err = n.hostModel(e); err != nil {
			n.cfg.log.Warn("the engine cannot give its model", "engine", e.Name(), "err", err)
		}
	}
	n.engMu.Lock()
	n.last = m
	n.engMu.Unlock()
	n.setEngine(nil, nil)
}

func randomKey() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func (n *Node) report() {
	if n.cfg.progress == nil && !n.cfg.log.Enabled(context.Background(), slog.LevelInfo) {
		return // nobody reads it (the metrics are read back on every event)
	}
	p := n.cfg.metrics.progress()
	p.TotalSteps = n.totalSteps.Load()
	n.logEpoch(p)
	if n.cfg.progress != nil {
		n.cfg.progress(p)
	}
}

// inRounds says whether a run's steps advance in state s.
func inRounds(s coordinator.RunState) bool {
	return s == coordinator.RoundTrain || s == coordinator.RoundWitness
}

// logEpoch writes the one INFO line an epoch's rounds get, when they end
// (per-step lines are DEBUG): the steps, the loss of this trainer's last
// batch, what it trained, sent and witnessed in them.
func (n *Node) logEpoch(p Progress) {
	was := n.lastProgress
	n.lastProgress = p
	switch {
	case inRounds(p.State) && !inRounds(was.State):
		n.epochStart = p
	case !inRounds(p.State) && inRounds(was.State):
		s := n.epochStart
		n.cfg.log.Info("epoch trained", "epoch", was.Epoch, "steps", fmt.Sprintf("%d-%d", s.Step, was.Step), "loss", p.Loss,
			"tokens", p.Tokens-s.Tokens, "rounds_applied", p.Applied-s.Applied, "witness_reports", p.Witnessed-s.Witnessed,
			"sent_bytes", p.Sent-s.Sent, "received_bytes", p.Received-s.Received, "now", p.State.String())
	}
}

// Run follows the run until it finishes, the node has trained the epochs it
// was asked to, or ctx ends.
func (n *Node) Run(ctx context.Context) error {
	snaps, err := n.backend.Subscribe(ctx, n.runID)
	if err != nil {
		return err
	}
	defer n.uploads.Wait()
	defer n.releaseEngine()
	defer n.closeEngine()
	defer n.finishAhead() // nothing uses the model after Run
	// Instructions go out from a goroutine of their own, one at a time in
	// the order asked: a send waits for the backend to confirm it (a
	// transaction's confirmation on Solana, the state file's fsync on the
	// server), tens of milliseconds in which the loop would otherwise not
	// take the snapshot that starts the next round, or a fetched result.
	n.sends = make(chan outgoing, 256)
	sender := make(chan struct{})
	go func() {
		defer close(sender)
		for o := range n.sends {
			n.send(ctx, o.ix)
			o.done()
		}
	}()
	defer func() {
		// What was asked is sent (or fails with ctx) before Run returns: a
		// node that leaves still says what it witnessed.
		close(n.sends)
		<-sender
	}()
	ev := events{fetched: make(chan fetchResult, 16), pulled: make(chan pullResult, 1), ticked: make(chan func(), 1)}
	n.fetchCtx, n.cancelFetch = context.WithCancel(ctx)
	defer func() { n.cancelFetch() }()
	anns, notices := n.net.Announcements(), n.net.Notices()
	drv := drive.New(n.m, effects{n: n, ctx: ctx, ev: ev})
	tick, stopTick := n.cfg.clock.Ticker(time.Second)
	defer stopTick()
	// A node that ticks the run checks for a due transition more often
	// than once a second (see machine.tickDue).
	var dueTick <-chan time.Time
	if n.cfg.ticking {
		c, stop := n.cfg.clock.Ticker(dueTickPeriod)
		defer stop()
		dueTick = c
	}
	for {
		var (
			rd    machine.Ready
			ended func() = func() {}
		)
		// Announcements already queued go before anything else: one may be
		// a trainer's second, conflicting result (equivocation), which must
		// be known before a fetched result completes a witness report that
		// would vouch for the first.
		queued, prior := p2p.Announcement{}, false
		select {
		case <-ctx.Done():
			return nil
		case queued = <-anns:
			prior = true
		default:
		}
		if prior {
			ended = n.cfg.clock.Work()
			rd = n.m.Announced(queued)
		} else {
			select {
			case <-ctx.Done():
				return nil
			case now := <-tick:
				ended = n.cfg.clock.Work()
				n.connectPeers(ctx)
				rd = n.m.Tick(uint64(now.Unix()))
			case now := <-dueTick:
				ended = n.cfg.clock.Work()
				rd = n.m.TickDue(uint64(now.Unix()))
			case done := <-ev.ticked:
				ended = done
				n.m.TickSent()
			case p := <-ev.pulled:
				ended = p.done
				rd = n.m.Pulled(p.list)
			case s, ok := <-snaps:
				if !ok {
					if ctx.Err() != nil {
						return nil
					}
					return errors.New("node: the coordinator subscription ended")
				}
				ended = n.cfg.clock.Work()
				if err := n.checkModel(ctx, &s.State.Model); err != nil {
					ended()
					return err
				}
				n.observe(s.State)
				n.prepareEngine(ctx)
				rd = n.m.Snapshot(s.State, uint64(n.cfg.clock.Now().Unix()))
			case a := <-anns:
				ended = n.cfg.clock.Work()
				rd = n.m.Announced(a)
			case no := <-notices:
				ended = n.cfg.clock.Work()
				rd = n.m.Noticed(no)
			case f := <-ev.fetched:
				ended = f.done
				n.fetches.finished(f.ann)
				n.startFetches(ctx, ev)
				if !n.judgeFetched(ctx, &f) {
					ended()
					continue // interrupted, not refused
				}
				rd = n.m.Fetched(f.ann, f.frame, f.err, f.invalid)
			}
		}
		err := drv.Do(rd)
		n.report()
		ended()
		if err != nil {
			if ctx.Err() != nil {
				return nil // shutting down: the work in hand was interrupted, not failed
			}
			return err
		}
		if why := drv.Done(); why != "" {
			n.cfg.log.Info("leaving", "why", why)
			return nil
		}
	}
}

// dueTickPeriod is how often a node that ticks the run (WithTicking) checks
// whether a transition is due: the chain's clock moves in whole seconds,
// read at slots (400 ms), so a finer check only shortens the wait.
const dueTickPeriod = 200 * time.Millisecond

// events are the channels on which work done in the background answers
// the loop in Run.
type events struct {
	fetched chan fetchResult
	pulled  chan pullResult
	ticked  chan func() // a tick landed or failed; call to end its work
}

// observe passes a snapshot to the network as data: the step window, the
// rounds' assignments and the allowlist; and says when the run leaves this
// node out of an epoch (reportSitOut).
func (n *Node) observe(s *coordinator.Coordinator) {
	n.reportSitOut(s)
	n.net.SetStep(s.Progress.Step)
	n.net.SetAssignments(machine.Assignments(s))
	n.fetches.setRing(n.id.P2P, s.Epoch.Clients[:s.Epoch.ClientsLen])
	allowed := make([]coordinator.ClientID, 0, int(s.Epoch.ClientsLen)+int(s.PendingLen))
	for _, c := range s.Epoch.Clients[:s.Epoch.ClientsLen] {
		allowed = append(allowed, c.ID)
	}
	allowed = append(allowed, s.Pending[:s.PendingLen]...)
	n.net.SetClients(allowed)
	n.cfg.metrics.State.Set(float64(s.RunState))
	n.cfg.metrics.Epoch.Set(float64(s.Progress.Epoch))
	n.cfg.metrics.Step.Set(float64(s.Progress.Step))
	n.totalSteps.Store(s.Config.TotalSteps)
	n.engineTimeout = engineTimeout(s)
}

// prepareEngine readies the engine opener while this node holds no engine
// (engine.Preparer), in the background: a PyTorch worker starts as soon as
// the node sees the run, not in the warmup, where starting it took longer
// than the warmup on a busy machine and the trainer began the first round
// seconds after the others. awaitEngine waits for it before the node
// joins. A failure is only logged: the load opens the engine again and
// says why it cannot.
func (n *Node) prepareEngine(ctx context.Context) {
	p, ok := n.cfg.engine.(engine.Preparer)
	if !ok || n.engine() != nil || n.preparing != nil {
		return
	}
	done := make(chan struct{})
	n.preparing = done
	timeout := n.engineTimeout
	go func() {
		defer close(done)
		release, err := p.Prepare(ctx, timeout)
		n.release = release
		if err != nil && ctx.Err() == nil {
			n.cfg.log.Warn("preparing the engine before joining", "engine", n.cfg.engine.Name(), "err", err)
		}
	}()
}

// checkModel asks the engine, before this node first joins, whether it
// can train the run's model at all (engine.ModelChecker): a Transformers run
// on the Go engine, or one whose config the PyTorch worker cannot build or
// fit, ends Run with that one line instead of a load that fails in the
// warmup after joining. It checks once, before the node first joins: later
// sources (the checkpoints the run records) are the same model, and a check
// starts a worker, seconds the node's loop must not spend in a run's
// rounds. GPT and Llama runs are left to the load, which says what is
// wrong with their checkpoints.
func (n *Node) checkModel(ctx context.Context, m *coordinator.Model) error {
	if m.Architecture != coordinator.ArchTransformers {
		return nil
	}
	if n.checkedModel {
		return nil
	}
	op := n.cfg.engine
	if op == nil {
		op = goengine.New(n.cfg.kernels)
	}
	if c, ok := op.(engine.ModelChecker); ok {
		if err := c.CheckModel(ctx, m); err != nil {
			return fmt.Errorf("node: refusing to join run %s: %w", n.runID, err)
		}
	}
	n.checkedModel = true
	return nil
}

// awaitEngine waits, before a join, for the engine's preparation, starting
// it if it has not started. A node prepares once a run: later epochs keep
// or reload the engine the first load opened.
func (n *Node) awaitEngine(ctx context.Context) {
	n.prepareEngine(ctx)
	if n.preparing == nil {
		return
	}
	select {
	case <-n.preparing:
	case <-ctx.Done():
	}
}

// releaseEngine waits for a preparation still in progress and releases
// what it prepared that no load opened: a worker does not outlive Run.
func (n *Node) releaseEngine() {
	if n.preparing == nil {
		return
	}
	<-n.preparing
	if n.release != nil {
		n.release()
	}
}

// connectPeers dials the configured peers that are not connected (the
// allowlist refuses them until the coordinator lists them, so this is
// retried every second). Each configured peer is checked by identity: being
// connected to as many others (who dialed this node) does not make the
// configured ones reachable, and a result's announcer is dialed directly.
func (n *Node) connectPeers(ctx context.Context) {
	if len(n.cfg.peers) == 0 {
		return
	}
	connected := map[coordinator.Pubkey]bool{}
	for _, k := range n.net.Peers() {
		connected[k] = true
	}
	for _, addr := range n.cfg.peers {
		if k, err := n.net.AddrKey(addr); err == nil && connected[k] {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := n.net.Connect(cctx, addr); err != nil {
			n.cfg.log.Debug("peer not reachable yet", "addr", addr, "err", err)
		}
		cancel()
	}
}

// logKernels says what the node computes on: the backend, its device, the
// precision of its products (and the one asked for, when it differs) and
// the device's free memory.
func logKernels(log *slog.Logger, be kernels.Backend, asked kernels.Precision) {
	attrs := []any{"backend", be.Name(), "precision", kernels.PrecisionOf(be)}
	if asked != "" && asked != kernels.PrecisionOf(be) {
		attrs = append(attrs, "asked", asked)
	}
	if d, ok := be.(interface{ Device() string }); ok {
		attrs = append(attrs, "device", d.Device())
	}
	if free, total, ok := kernels.DeviceMemory(be); ok {
		attrs = append(attrs, "free_memory", fmt.Sprintf("%.1f of %.1f GiB", float64(free)/(1<<30), float64(total)/(1<<30)))
	}
	log.Info("kernels", attrs...)
}
