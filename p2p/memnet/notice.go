package memnet

import (
	"context"
	"errors"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// maxEarlyNotices bounds the notices kept for a view not reached yet.
const maxEarlyNotices = 1024

// Notify implements p2p.Network: the notice is signed and spread as gossip
// spreads it. A peer whose view has not reached the notice's round yet
// keeps it until it does (p2p/libp2p's trainer re-sends it instead; in
// memory nothing is lost on the way, so keeping it is the same).
func (n *Node) Notify(ctx context.Context, step uint32, batch p2p.BatchRange) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return p2p.ErrClosed
	}
	n.nonce++
	no := p2p.Notice{RunID: n.runID, Step: step, Batch: batch, Trainer: coordinator.ClientID{Signer: n.signer}, Nonce: n.nonce}
	n.mu.Unlock()
	if err := no.Sign(n.key); err != nil {
		return err
	}
	n.spreadNotice(no)
	return nil
}

// spreadNotice carries a notice through the network as gossip does (see
// spread): a node that takes it as new relays it to its peers.
func (n *Node) spreadNotice(no p2p.Notice) {
	q := n.connected()
	for len(q) > 0 {
		p := q[0]
		q = q[1:]
		if p.receiveNotice(no) {
			q = append(q, p.connected()...)
		}
	}
}

// receiveNotice takes a gossiped notice, validated as p2p/libp2p's
// validator does, delivers it once per trainer, step and batch, and reports
// whether it is new (to be relayed).
func (n *Node) receiveNotice(no p2p.Notice) bool {
	if no.Trainer.P2P == n.id {
		return false
	}
	err := no.Verify()
	if err == nil {
		err = n.checkViewOf(no.RunID, no.Step, no.Batch, no.Trainer)
	}
	if errors.Is(err, p2p.ErrNotAssigned) {
		n.mu.Lock()
		// The view lags the notice's round: the round after this node's,
		// or this node's own step before its batches are known here (a
		// warmup's view carries the step of its first round and assigns
		// nothing yet). libp2p's trainer re-sends its notice until its
		// result is out; memnet delivers once, so it keeps the notice for
		// the next view instead of losing the trainer's place.
		lagging := no.Step == n.step+1 || (no.Step == n.step && !n.assignments.Assigns(no.Step))
		ahead := lagging && len(n.early) < maxEarlyNotices
		if ahead {
			n.early = append(n.early, no)
		}
		n.mu.Unlock()
		if ahead {
			return false
		}
	}
	if err != nil {
		n.rejectNotice(err)
		return false
	}
	k := no.Key()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.noticed[k] {
		return false
	}
	n.noticed[k] = true
	select {
	case n.notices <- no:
	default:
		delete(n.noticed, k)
	}
	return true
}

// Notices implements p2p.Network.
func (n *Node) Notices() <-chan p2p.Notice { return n.notices }
