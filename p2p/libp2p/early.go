package libp2p

import (
	"errors"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// An announcement for the step after this node's can come before the
// coordinator snapshot that starts that round does: its trainer saw the
// round start first (snapshots reach trainers at different times), trained
// and published at once. Its batch is then not in this node's assignments
// yet. So can one for this node's own step while its view assigns nothing
// at that step: a warmup's view carries the step of the first round.
// Ignoring it would cost this node the result until a pull (a second, and
// the round waits for this node's witness report), so the validator
// keeps it, signed and from a client of the epoch, until SetAssignments
// installs the next view, and judges it then. It is not relayed meanwhile
// (flood publishing has already sent it to every peer of its trainer).
type earlyAnnouncement struct {
	a    p2p.Announcement
	raw  []byte
	from peer.ID
}

// At most this many early announcements are kept per trainer and in all: an
// honest trainer has one result per round, and a liar fills only its own
// share.
const (
	maxEarlyPerTrainer = 4
	maxEarly           = 1024
)

// holdEarly keeps a for the next view if err says only that its batch is
// not assigned yet (at the step after this node's, or at its own step of
// a view that assigns nothing there), and says what it did.
// view is the view (n.views) read before the check that found err: a view
// installed since may assign the batch already, so nothing is kept then. a's
// signature has been verified (check verifies it before the view).
func (n *Node) holdEarly(a p2p.Announcement, raw []byte, from peer.ID, err error, view uint64) int {
	if !errors.Is(err, p2p.ErrNotAssigned) || errors.As(err, new(signedMalformed)) {
		return earlyNo
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.views.Load() != view {
		return earlyViewMoved
	}
	if cur := n.step.Load(); a.Step != cur+1 && (a.Step != cur || n.assignments.Assigns(cur)) {
		return earlyNo
	}
	if id, ok := n.clients[a.Trainer.P2P]; !ok || id != a.Trainer {
		return earlyNo
	}
	k := nonceKey{a.Trainer.P2P, a.Nonce}
	if _, dup := n.early[k]; dup {
		return earlyKept
	}
	if len(n.early) >= maxEarly || n.earlyPer[a.Trainer.P2P] >= maxEarlyPerTrainer {
		return earlyNo
	}
	n.early[k] = earlyAnnouncement{a: a, raw: raw, from: from}
	n.earlyPer[a.Trainer.P2P]++
	n.m.Early.Inc()
	return earlyKept
}

// releaseEarly judges the early announcements against the view just
// installed: it delivers those that pass, keeps those still a step ahead,
// and refuses the rest as the validator would have.
func (n *Node) releaseEarly() {
	n.mu.Lock()
	if len(n.early) == 0 {
		n.mu.Unlock()
		return
	}
	pending, view := n.early, n.views.Load()
	n.early, n.earlyPer = map[nonceKey]earlyAnnouncement{}, map[coordinator.Pubkey]int{}
	n.mu.Unlock()
	for _, e := range pending {
		err := n.checkView(e.a.RunID, e.a.Step, e.a.Batch, e.a.Trainer)
		switch {
		case err == nil:
			if !n.markSeen(&e.a) {
				continue // it came again meanwhile, or by a pull
			}
			n.m.Accepted.Inc()
			if n.hold(&e.a, e.raw) {
				n.handOver(e.a)
			}
		case n.holdEarly(e.a, e.raw, e.from, err, view) == earlyKept:
		default:
			n.reject(err, e.from)
		}
	}
}

// hold keeps an accepted announcement for pullers and reports whether the
// trainer has not had it yet (and marks it delivered).
func (n *Node) hold(a *p2p.Announcement, raw []byte) (fresh bool) {
	k := keyOf(a)
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.heldKeys[k]; !ok && len(n.held[a.Step]) < p2p.MaxPullAnnouncements {
		n.heldKeys[k] = struct{}{}
		n.held[a.Step] = append(n.held[a.Step], raw)
	}
	if _, ok := n.delivered[k]; ok {
		return false
	}
	n.delivered[k] = struct{}{}
	n.m.Delivered.Inc()
	return true
}

// holdEarly's answers.
const (
	earlyNo        = iota // not an early announcement: refuse it
	earlyKept             // kept until the view moves
	earlyViewMoved        // the view moved since view: check it again
)
