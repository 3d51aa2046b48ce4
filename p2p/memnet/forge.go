//go:build adversary

package memnet

import (
	"context"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

var _ p2p.Forger = (*Node)(nil)

// Forge implements p2p.Forger (adversary build only): the announcement goes
// to every connected peer, whose checks must refuse it.
func (n *Node) Forge(ctx context.Context, step uint32, batch p2p.BatchRange, payload []byte, ref p2p.BlobRef) (p2p.Announcement, error) {
	if err := ctx.Err(); err != nil {
		return p2p.Announcement{}, err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return p2p.Announcement{}, p2p.ErrClosed
	}
	n.nonce++
	a := p2p.Announcement{RunID: n.runID, Step: step, Batch: batch, Trainer: coordinator.ClientID{Signer: n.signer},
		Commitment: p2p.Commitment(step, batch, payload), Nonce: n.nonce, Blob: ref}
	n.mu.Unlock()
	a.SignUnchecked(n.key)
	n.keep(a, payload)
	var q []delivery
	for _, p := range n.connected() {
		q = append(q, delivery{p, a})
	}
	spread(q)
	return a, nil
}
