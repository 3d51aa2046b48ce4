package libp2p

import (
	"context"
	"fmt"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// checkNotice decodes and validates a notice from outside as check does an
// announcement: size, structure, signature, run, step window, assignment.
func (n *Node) checkNotice(data []byte) (p2p.Notice, error) {
	if len(data) > p2p.MaxNoticeSize {
		return p2p.Notice{}, fmt.Errorf("%w: a notice of %d bytes", p2p.ErrOversize, len(data))
	}
	no, err := p2p.DecodeNotice(data)
	if err != nil {
		return no, err
	}
	if err := no.Verify(); err != nil {
		return no, err
	}
	return no, n.checkView(no.RunID, no.Step, no.Batch, no.Trainer)
}

// validateNotice is the topic validator's judgement of a notice: rejected
// (and so penalised in the sender's gossip score) where an announcement
// would be, ignored where only this node's view disagrees or it is a replay.
// A notice for a batch this node does not know assigned yet is not kept as
// an early announcement is: its trainer re-sends it (renotify).
func (n *Node) validateNotice(from peer.ID, m *pubsub.Message) pubsub.ValidationResult {
	if from == n.host.ID() {
		if no, err := p2p.DecodeNotice(m.Data); err == nil {
			n.markNonce(no.Trainer.P2P, no.Nonce, no.Step)
		}
		return pubsub.ValidationAccept
	}
	no, err := n.checkNotice(m.Data)
	if err != nil {
		n.refuse(noticeMessage, err, from)
		if viewDependent(err) {
			return pubsub.ValidationIgnore
		}
		return pubsub.ValidationReject
	}
	if !n.markNonce(no.Trainer.P2P, no.Nonce, no.Step) {
		n.refuse(noticeMessage, p2p.ErrReplayed, from)
		return pubsub.ValidationIgnore
	}
	m.ValidatorData = no
	return pubsub.ValidationAccept
}

// handOverNotice gives a valid notice to the trainer once per trainer, step
// and batch, without blocking.
func (n *Node) handOverNotice(no p2p.Notice) {
	k := no.Key()
	n.mu.Lock()
	_, done := n.noticed[k]
	n.noticed[k] = struct{}{}
	n.mu.Unlock()
	if done {
		return
	}
	select {
	case n.notices <- no:
	default:
		// The trainer is not draining: the re-sent copy can still come.
		n.mu.Lock()
		delete(n.noticed, k)
		n.mu.Unlock()
		n.log.Warn("notice dropped: channel full", "step", no.Step)
	}
}

// Notices delivers each valid notice of other trainers once per trainer,
// step and batch.
func (n *Node) Notices() <-chan p2p.Notice { return n.notices }

// Notify signs and gossips a notice that this node has begun training batch
// of step, and keeps it to re-send (renotify) until the result is published
// or the round is over.
func (n *Node) Notify(ctx context.Context, step uint32, batch p2p.BatchRange) error {
	if err := n.alive(); err != nil {
		return err
	}
	no := p2p.Notice{RunID: *n.cfg.runID, Step: step, Batch: batch, Trainer: coordinator.ClientID{Signer: n.signer}}
	if err := n.sendNotice(ctx, &no); err != nil {
		return err
	}
	n.mu.Lock()
	n.ownNotices[no.Key()] = no
	n.mu.Unlock()
	return nil
}

func (n *Node) sendNotice(ctx context.Context, no *p2p.Notice) error {
	no.Nonce = n.nonce.Add(1)
	if err := no.Sign(n.key); err != nil {
		return err
	}
	raw, err := no.MarshalBinary()
	if err != nil {
		return err
	}
	return n.topic.Publish(ctx, raw)
}

// renotify re-sends this node's notices of the current round whose result
// is not published yet: a peer whose view lagged when the first came (the
// round had not begun for it) refused it, and without it that peer would
// take a trainer that is still computing for a silent one.
func (n *Node) renotify(ctx context.Context) {
	cur := n.step.Load()
	n.mu.Lock()
	var again []p2p.Notice
	for _, no := range n.ownNotices {
		if no.Step == cur {
			again = append(again, no)
		}
	}
	n.mu.Unlock()
	for _, no := range again {
		if err := n.sendNotice(ctx, &no); err != nil {
			n.log.Debug("notice re-send failed", "step", no.Step, "err", err)
		}
	}
}
