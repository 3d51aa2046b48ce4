package node

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"sort"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
)

// pullResult is a pull's answer; done ends the work it counts as.
type pullResult struct {
	list []p2p.Announcement
	done func()
}

type fetchResult struct {
	done    func() // ends the work the fetch counts as, once Run has taken it
	ann     p2p.Announcement
	frame   *distro.Frame
	size    int
	err     error
	invalid bool // the result itself is bad (not a transient failure)
}

// Fetches in flight are bounded, in total and per announcing trainer, so
// that announcements (a trainer may send many, equivocating) cost a queue
// entry each, not a goroutine and a buffer each; the rest wait their turn.
const (
	maxFetches        = 16
	maxFetchesPerPeer = 2
)

// fetchQueue is the driver's fetch bookkeeping (the Run loop's alone).
type fetchQueue struct {
	waiting  []p2p.Announcement
	inFlight int
	perPeer  map[coordinator.Pubkey]int
	// The ring order (see startFetches): each client's place after this
	// node on the ring of the epoch's p2p keys, the fetches of each step
	// ended so far, and when each waiting announcement was queued.
	rank   map[coordinator.Pubkey]int
	ended  map[uint32]int
	queued map[coordinator.Hash]time.Time
}

// ringPatience is how long an announcement outside the ring window waits
// before it is fetched anyway: its place may be behind a trainer that
// never announces (dead, or dropped), which would hold the window forever.
const ringPatience = 2 * time.Second

// ringPos is a p2p key's place on the ring.
func ringPos(k coordinator.Pubkey) uint64 { return binary.LittleEndian.Uint64(k[:8]) }

// setRing ranks the epoch's clients after self on the ring of their p2p
// keys.
func (q *fetchQueue) setRing(self coordinator.Pubkey, clients []coordinator.Client) {
	others := make([]coordinator.Pubkey, 0, len(clients))
	for _, c := range clients {
		if c.ID.P2P != self {
			others = append(others, c.ID.P2P)
		}
	}
	at := ringPos(self)
	sort.Slice(others, func(i, j int) bool { return ringPos(others[i])-at < ringPos(others[j])-at })
	q.rank = make(map[coordinator.Pubkey]int, len(others))
	for i, k := range others {
		q.rank[k] = i
	}
}

func (q *fetchQueue) finished(a p2p.Announcement) {
	if q.ended == nil {
		q.ended = map[uint32]int{}
	}
	q.ended[a.Step]++
	for st := range q.ended {
		if st+4 < a.Step {
			delete(q.ended, st)
		}
	}
	q.inFlight--
	if q.perPeer[a.Trainer.P2P]--; q.perPeer[a.Trainer.P2P] <= 0 {
		delete(q.perPeer, a.Trainer.P2P)
	}
}

// drop forgets the waiting fetches (machine.Ready.DropFetches).
func (q *fetchQueue) drop() {
	clear(q.waiting)
	q.waiting = q.waiting[:0]
	clear(q.queued)
}

// startFetches starts the waiting fetches that the bounds allow, the
// oldest step first and, within a step, in ring order: every node ranks the
// epoch's clients on the ring of p2p keys starting after itself, and
// fetches from the maxFetches announcers after those it has fetched so far,
// even when others announced first. Flood publishing delivers a round's
// announcements to every node in about the same order, so fetching in
// arrival order sent every node to the same first announcers, whose
// uplinks then carried everyone's fetches while the rest sat idle (the
// first bottleneck of docs/scale.md: 97 s rounds at 256 trainers on 1
// Gbit/s, 12.6 s in ring order). With maxFetches or fewer peers the window
// holds everyone and only the order changes. An announcement waits for the
// window at most ringPatience. Each fetched payload is decoded within the
// limits of the run's model (its exact tensors and entries), never the
// protocol's.
func (n *Node) startFetches(ctx context.Context, ev events) {
	lim := distro.DefaultLimits
	if p := n.runPlan(); p != nil {
		lim = p.Limits()
	}
	for _, a := range n.fetches.take(n.cfg.clock.Now()) {
		working := n.cfg.clock.Work() // until Run has taken the result
		fctx := n.fetchCtx
		if fctx == nil {
			fctx = ctx // outside Run (tests)
		}
		go func() {
			payload, err := n.net.Fetch(fctx, a)
			// Bytes that do not match the commitment, or that are no frame,
			// and a signed announcement no honest trainer publishes
			// (malformed, oversized), are the announcer's fault; anything
			// else may work next time.
			r := fetchResult{ann: a, err: err, size: len(payload), done: working,
				invalid: errors.Is(err, p2p.ErrCommitmentMismatch) || errors.Is(err, p2p.ErrOversize) || errors.Is(err, p2p.ErrMalformed)}
			if err == nil {
				r.frame, r.err = distro.DecodeFrame(payload, lim)
				r.invalid = r.err != nil
			}
			select {
			case ev.fetched <- r:
			case <-ctx.Done():
				working()
			}
		}()
	}
}

// take returns the waiting fetches to start now (see startFetches) and
// counts them in flight.
func (q *fetchQueue) take(now time.Time) []p2p.Announcement {
	if q.perPeer == nil {
		q.perPeer = map[coordinator.Pubkey]int{}
		q.queued = map[coordinator.Hash]time.Time{}
	}
	for _, a := range q.waiting {
		if _, ok := q.queued[a.Commitment]; !ok {
			q.queued[a.Commitment] = now
		}
	}
	rank := func(a p2p.Announcement) int {
		if r, ok := q.rank[a.Trainer.P2P]; ok {
			return r
		}
		return -1 // not a client of the epoch as this node knows it: no place to wait for
	}
	sort.SliceStable(q.waiting, func(i, j int) bool {
		if a, b := q.waiting[i], q.waiting[j]; a.Step != b.Step {
			return a.Step < b.Step
		}
		return rank(q.waiting[i]) < rank(q.waiting[j])
	})
	var start []p2p.Announcement
	rest := q.waiting[:0]
	for _, a := range q.waiting {
		inWindow := rank(a) < q.ended[a.Step]+maxFetches || now.Sub(q.queued[a.Commitment]) >= ringPatience
		if q.inFlight >= maxFetches || q.perPeer[a.Trainer.P2P] >= maxFetchesPerPeer || !inWindow {
			rest = append(rest, a)
			continue
		}
		delete(q.queued, a.Commitment)
		q.inFlight++
		q.perPeer[a.Trainer.P2P]++
		start = append(start, a)
	}
	clear(q.waiting[len(rest):])
	q.waiting = rest
	return start
}

// judgeFetched checks a fetched frame against the run's plan (the one
// place a peer's frame is checked: every result the machine holds passed
// here) and reports what came of the fetch, or false when it was only
// interrupted by the node's end. A frame that fails is marked invalid,
// reported to the network, and logged once per trainer at warning level.
func (n *Node) judgeFetched(ctx context.Context, f *fetchResult) bool {
	if p := n.runPlan(); f.err == nil && p != nil {
		if f.err = p.Check(f.frame); f.err != nil {
			f.invalid = true
		}
	}
	switch {
	case f.err != nil && ctx.Err() != nil:
		return false
	case f.invalid:
		level := slog.LevelDebug
		if !n.badPeers[f.ann.Trainer.P2P] && len(n.badPeers) < 4096 {
			n.badPeers[f.ann.Trainer.P2P] = true
			level = slog.LevelWarn
		}
		n.cfg.log.Log(ctx, level, "ignoring a peer's result", "step", f.ann.Step, "batch", f.ann.Batch.Start, "trainer", f.ann.Trainer.Signer.String(), "err", f.err)
		n.net.ReportPeer(f.ann.Trainer.P2P, "bad result")
	case errors.Is(f.err, context.Canceled):
		n.cfg.log.Debug("fetch dropped: this node is no longer a client of the epoch", "step", f.ann.Step, "batch", f.ann.Batch.Start)
	case f.err != nil:
		n.cfg.log.Info("fetch failed; a pull will try again", "step", f.ann.Step, "batch", f.ann.Batch.Start, "err", f.err)
	default:
		n.cfg.metrics.ReceivedBytes.Add(float64(f.size))
	}
	return true
}
