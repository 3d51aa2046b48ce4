package simscale

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sort"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/node/drive"
	"github.com/psyche-go/psyche/trainer/node/machine"
)

// trainer drives one real machine.Machine through trainer/node's own
// driver (drive.Driver), in virtual time: it is the driver's Effects, and
// where a real node computes, it pauses the driver for the modelled time.
// Applies, loads and training that is not ahead hold the driver (events
// wait in its queue); training ahead runs beside it; instructions go out
// one at a time; fetches are bounded in total and per announcer.
type trainer struct {
	s    *Sim
	idx  int
	host int
	id   coordinator.ClientID
	m    *machine.Machine
	d    *drive.Driver

	ahead *aheadRun

	// The p2p layer's state.
	step      uint32 // SetStep's window
	delivered map[coordinator.Hash]bool
	held      map[uint32][]p2p.Announcement // valid announcements by step, for pulls
	own       []p2p.Announcement            // this node's, re-announced
	waiting   []p2p.Announcement            // fetches not started
	inFlight  int
	perPeer   map[coordinator.Pubkey]int
	results   map[uint32]int             // results fetched, by step
	rank      map[coordinator.Pubkey]int // announcers in this node's ring order (FetchRing)

	outbox  []coordinator.Instruction
	sending bool
}

// aheadRun is a gradient being trained ahead (TrainWork.Ahead).
type aheadRun struct {
	work   machine.TrainWork
	doneAt time.Duration
}

// Sizes of the small messages the model counts.
const (
	fetchRequestBytes = 128 // a blob stream request: the block list's digest, framing
	responseBytes     = 256 // the server's answer to an instruction (HTTP, JSON)
	requestOverhead   = 92 + 96 + 200
)

func newTrainer(s *Sim, i int) *trainer {
	t := &trainer{s: s, idx: i, host: i, id: identity(s.cfg.Seed, i), delivered: map[coordinator.Hash]bool{},
		held: map[uint32][]p2p.Announcement{}, perPeer: map[coordinator.Pubkey]int{}, results: map[uint32]int{}}
	t.m = machine.New(t.id, 0, false, s.rng.Uint64)
	t.d = drive.New(t.m, t)
	return t
}

// done says the machine has told this node to stop.
func (t *trainer) done() bool { return t.d.Done() != "" }

// start begins the node's one-second tick and its re-announcements, each at
// a phase of its own.
func (t *trainer) start() {
	var tick, reannounce func()
	tick = func() {
		if t.done() {
			return
		}
		now := t.s.unixNow()
		t.post(func() machine.Ready { return t.m.Tick(now) })
		t.s.sched.after(time.Second, tick)
	}
	reannounce = func() {
		if t.done() {
			return
		}
		t.reannounce()
		t.s.sched.after(t.s.cfg.Reannounce, reannounce)
	}
	t.s.sched.after(time.Duration(t.s.rng.Int64N(int64(time.Second))), tick)
	t.s.sched.after(time.Duration(t.s.rng.Int64N(int64(t.s.cfg.Reannounce))), reannounce)
}

// snapshot takes a coordinator state from the stream (Node.observe, then
// the machine's snapshot event).
func (t *trainer) snapshot(st *coordinator.Coordinator) {
	t.step = st.Progress.Step
	for s := range t.held {
		if s+2 < t.step {
			delete(t.held, s)
		}
	}
	now := t.s.unixNow()
	t.post(func() machine.Ready { return t.m.Snapshot(st, now) })
}

func (t *trainer) post(ev func() machine.Ready) {
	t.d.Post(ev)
	t.pump()
}

// pump lets the driver take events and do their Readies until it pauses
// or has nothing to do.
func (t *trainer) pump() { t.s.fail(t.d.Pump()) }

// resumeAfter resumes the paused driver d of virtual time from now.
func (t *trainer) resumeAfter(d time.Duration) {
	t.s.sched.after(d, func() { t.s.fail(t.d.Resume()) })
}

// hold pauses the driver for d of virtual time.
func (t *trainer) hold(d time.Duration) drive.Step {
	t.resumeAfter(d)
	return drive.Later
}

// waitAhead holds the driver until the gradient trained ahead is done, as
// Node.finishAhead does, and reports whether it had to.
func (t *trainer) waitAhead() bool {
	if t.ahead != nil && t.ahead.doneAt > t.s.sched.now {
		t.resumeAfter(t.ahead.doneAt - t.s.sched.now)
		return true
	}
	return false
}

// The driver's effects (drive.Effects): compute is modelled time, the
// network is the simulated one.

func (t *trainer) Apply(w *machine.ApplyWork) (drive.Step, error) {
	if t.waitAhead() { // Node.apply drops the gradient trained ahead
		return drive.Again, nil
	}
	t.ahead = nil
	d := t.s.cfg.ApplyTime + time.Duration(len(w.Frames))*t.s.cfg.ApplyPerResult
	t.s.met.applied(w.Step, len(w.Frames), len(w.Missing))
	if d > 0 {
		return t.hold(d), nil
	}
	return drive.Done, nil
}

func (t *trainer) Load(*machine.LoadWork) (drive.Step, error) {
	if t.waitAhead() {
		return drive.Again, nil
	}
	t.ahead = nil
	if t.s.cfg.LoadTime > 0 {
		return t.hold(t.s.cfg.LoadTime), nil
	}
	return drive.Done, nil
}

func (t *trainer) TrainAhead(w machine.TrainWork) (drive.Step, error) {
	if t.waitAhead() {
		return drive.Again, nil
	}
	t.ahead = &aheadRun{work: w, doneAt: t.s.sched.now + t.s.cfg.StepTime}
	return drive.Done, nil
}

func (t *trainer) Train(w *machine.TrainWork) (drive.Step, error) {
	if t.waitAhead() {
		return drive.Again, nil
	}
	a := t.ahead
	t.ahead = nil
	reuse := w.Reuse && a != nil && a.work.Step == w.Step && a.work.Batch == w.Batch
	if !reuse && t.s.cfg.StepTime > 0 {
		return t.hold(t.s.cfg.StepTime), nil
	}
	return drive.Done, nil
}

func (t *trainer) Trained(w *machine.TrainWork) (p2p.Announcement, *distro.Frame, machine.TrainStats, error) {
	return t.publish(w.Step, w.Batch), nil, machine.TrainStats{Loss: 2.5}, nil
}

// errNotModelled answers the work the simulator does not model: its runs
// verify nothing (verification_percent 0).
var errNotModelled = errors.New("simscale: verified work is not modelled")

func (t *trainer) ReferenceLosses(*machine.TrainWork) (map[uint64]float32, error) {
	return nil, errNotModelled
}

func (t *trainer) Verify(machine.VerifyWork) (float32, float32, bool, error) {
	return 0, 0, false, errNotModelled
}

func (t *trainer) Send(ixs []coordinator.Instruction) {
	t.outbox = append(t.outbox, ixs...)
	t.sendNext()
}

func (t *trainer) Fetch(anns []p2p.Announcement) {
	t.waiting = append(t.waiting, anns...)
	if t.s.cfg.FetchOrder == FetchRing && len(anns) > 0 {
		// Each node starts with the announcer after itself on a ring of
		// p2p keys, so the nodes' first fetches spread over every uplink
		// instead of all going to the first announcers.
		self := ringPos(t.id.P2P)
		sort.SliceStable(t.waiting, func(i, j int) bool {
			return ringPos(t.waiting[i].Trainer.P2P)-self < ringPos(t.waiting[j].Trainer.P2P)-self
		})
	}
	t.startFetches()
}

// The simulated runs have no equivocators, copies, checkpoints or ticking
// trainers; what a real node does for these is logging and network
// scoring, which the model does not count.

func (t *trainer) DropFetches()                    {}
func (t *trainer) Report([]coordinator.Pubkey)     {}
func (t *trainer) Checked([]machine.ReportChecked) {}
func (t *trainer) Refused([]machine.RefusedResult) {}
func (t *trainer) Share(uint32)                    {}
func (t *trainer) Save(machine.SaveWork)           {}
func (t *trainer) Tick()                           {}
func (t *trainer) Pull(step uint32)                { t.pull(step) }

// sendNext sends the next instruction once the one before has been
// answered (Node.Run's sender goroutine).
func (t *trainer) sendNext() {
	if t.sending || len(t.outbox) == 0 || t.done() {
		return
	}
	ix := t.outbox[0]
	t.outbox = t.outbox[1:]
	t.sending = true
	sv := t.s.server
	size := requestOverhead + len(coordinator.EncodeInstruction(ix))
	t.s.net.message(t.host, sv.host, size, func() {
		sv.instruction(t.id.Signer, ix)
		t.s.net.message(sv.host, t.host, responseBytes, func() {
			t.sending = false
			t.sendNext()
		})
	})
}

// publish stores this node's result and flood-publishes its announcement.
func (t *trainer) publish(step uint32, batch p2p.BatchRange) p2p.Announcement {
	size := t.s.cfg.PayloadBytes
	ref := p2p.BlobRef{Size: uint64(size)}
	for i := int64(0); i*p2p.BlockSize < size; i++ {
		var b [16]byte
		binary.LittleEndian.PutUint32(b[:], uint32(t.idx))
		binary.LittleEndian.PutUint32(b[4:], step)
		binary.LittleEndian.PutUint64(b[8:], uint64(i))
		ref.Blocks = append(ref.Blocks, sha256.Sum256(b[:]))
	}
	a := p2p.Announcement{RunID: runID, Step: step, Batch: batch, Trainer: t.id, Commitment: p2p.CommitmentOf(step, batch, ref), Blob: ref}
	t.delivered[a.Commitment] = true
	t.held[step] = append(t.held[step], a)
	t.own = append(t.own, a)
	t.s.met.published(step, t.s.sched.now)
	for _, o := range t.s.trainers {
		if o != t {
			t.s.net.message(t.host, o.host, t.s.annBytes, func() { o.receive(a) })
		}
	}
	return a
}

// receive takes an announcement from the network: the first copy is
// validated, held for pulls, relayed to the mesh and delivered.
func (t *trainer) receive(a p2p.Announcement) {
	if t.delivered[a.Commitment] || t.done() {
		return
	}
	t.delivered[a.Commitment] = true
	t.held[a.Step] = append(t.held[a.Step], a)
	t.relay(1)
	t.d.Announce(func() machine.Ready { return t.m.Announced(a) })
	t.pump()
}

// relay counts msgs announcements relayed to this node's gossip mesh, and
// the copies its mesh relays to it: in a mesh of degree D each node sends
// and receives about D copies of every message.
func (t *trainer) relay(msgs int) {
	d := min(t.s.cfg.MeshDegree, len(t.s.trainers)-2)
	if d <= 0 {
		return
	}
	bytes := float64(msgs * d * t.s.annBytes)
	h := &t.s.net.hosts[t.host]
	h.sentBytes += bytes
	h.recvBytes += bytes
	h.sentMsgs += float64(msgs * d)
	h.recvMsgs += float64(msgs * d)
}

// reannounce sends this node's results in the step window again, with a
// fresh nonce: flood-published to every peer and relayed by each.
func (t *trainer) reannounce() {
	keep := t.own[:0]
	for _, a := range t.own {
		if a.Step+2 >= t.step {
			keep = append(keep, a)
		}
	}
	t.own = keep
	for _, a := range t.own {
		if a.Step > t.step+1 {
			continue
		}
		t.s.met.reannounced++
		for _, o := range t.s.trainers {
			if o != t {
				t.s.net.count(t.host, o.host, float64(t.s.annBytes), 1)
				o.relay(1)
			}
		}
	}
}

// startFetches starts the waiting fetches the bounds allow, oldest first
// (Node.startFetches): each streams the blob from its announcer.
func (t *trainer) startFetches() {
	rest := t.waiting[:0]
	for _, a := range t.waiting {
		if t.inFlight >= t.s.cfg.MaxFetches || t.perPeer[a.Trainer.P2P] >= t.s.cfg.MaxFetchesPerPeer || !t.inWindow(a) {
			rest = append(rest, a)
			continue
		}
		t.inFlight++
		t.perPeer[a.Trainer.P2P]++
		src := t.s.byP2P[a.Trainer.P2P]
		t.s.net.message(t.host, src.host, fetchRequestBytes, func() {
			t.s.net.transfer(src.host, t.host, int(a.Blob.Size), nil, func() { t.fetched(a) })
		})
	}
	clear(t.waiting[len(rest):])
	t.waiting = rest
}

func (t *trainer) fetched(a p2p.Announcement) {
	t.inFlight--
	if t.perPeer[a.Trainer.P2P]--; t.perPeer[a.Trainer.P2P] <= 0 {
		delete(t.perPeer, a.Trainer.P2P)
	}
	if t.results[a.Step]++; t.results[a.Step] == len(t.s.trainers)-1 {
		t.s.met.allResults(a.Step, t.s.sched.now)
	}
	t.startFetches()
	t.post(func() machine.Ready { return t.m.Fetched(a, nil, nil, false) })
}

// pull asks every peer, PullParallel at a time, for the announcements it
// holds for step (p2p/libp2p's Pull under trainer/node's 2 s limit). Each
// answer is every announcement the peer holds for the step, however many
// the asker has: its bytes load the peers' uplinks and this downlink as a
// steady rate for the pull's duration.
func (t *trainer) pull(step uint32) {
	net := t.s.net
	me := &net.hosts[t.host]
	var (
		dur   time.Duration
		wave  time.Duration
		total float64
		resp  = make([]float64, len(t.s.trainers))
		asked int
	)
	for _, o := range t.s.trainers {
		if o == t {
			continue
		}
		resp[o.idx] = float64(3 + len(o.held[step])*(4+t.s.annBytes))
		total += resp[o.idx]
		wave = max(wave, 2*net.delay(t.host, o.host))
		if asked++; asked%t.s.cfg.PullParallel == 0 {
			dur += wave
			wave = 0
		}
	}
	dur += wave + time.Duration(total/me.Down*float64(time.Second))
	dur = max(min(dur, t.s.cfg.PullTimeout), time.Millisecond)
	rate := func(b float64) float64 { return b / dur.Seconds() }
	me.bgDown += rate(total)
	for _, o := range t.s.trainers {
		if o != t {
			net.count(t.host, o.host, float64(p2p.MaxPullRequestSize), 1)
			net.count(o.host, t.host, resp[o.idx], 1)
			net.hosts[o.host].bgUp += rate(resp[o.idx])
		}
	}
	if t.s.met.measured(step) {
		t.s.met.pulls++
	}
	t.s.sched.after(dur, func() {
		me.bgDown -= rate(total)
		var list []p2p.Announcement
		for _, o := range t.s.trainers {
			net.hosts[o.host].bgUp -= rate(resp[o.idx])
			for _, a := range o.held[step] {
				if o != t && !t.delivered[a.Commitment] {
					t.delivered[a.Commitment] = true
					t.held[a.Step] = append(t.held[a.Step], a)
					list = append(list, a)
				}
			}
		}
		t.post(func() machine.Ready { return t.m.Pulled(list) })
	})
}

// ringPos is a p2p key's place on the fetch ring.
func ringPos(k coordinator.Pubkey) uint64 { return binary.LittleEndian.Uint64(k[:8]) }

// inWindow says whether a's fetch may start now. In ring order a node
// fetches only from the MaxFetches announcers that follow the ones it has
// fetched, in its own ring order, even when others announced first: the
// first announcers would otherwise take every node's first fetches.
func (t *trainer) inWindow(a p2p.Announcement) bool {
	if t.s.cfg.FetchOrder != FetchRing {
		return true
	}
	if t.rank == nil {
		t.rank = map[coordinator.Pubkey]int{}
		self := ringPos(t.id.P2P)
		var others []*trainer
		for _, o := range t.s.trainers {
			if o != t {
				others = append(others, o)
			}
		}
		sort.Slice(others, func(i, j int) bool { return ringPos(others[i].id.P2P)-self < ringPos(others[j].id.P2P)-self })
		for i, o := range others {
			t.rank[o.id.P2P] = i
		}
	}
	return t.rank[a.Trainer.P2P] < t.results[a.Step]+t.s.cfg.MaxFetches
}
