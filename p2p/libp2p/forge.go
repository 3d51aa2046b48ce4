//go:build adversary

package libp2p

import (
	"context"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

var _ p2p.Forger = (*Node)(nil)

// Forge implements p2p.Forger (adversary build only).
func (n *Node) Forge(ctx context.Context, step uint32, batch p2p.BatchRange, payload []byte, ref p2p.BlobRef) (p2p.Announcement, error) {
	if err := n.alive(); err != nil {
		return p2p.Announcement{}, err
	}
	bs, hs := split(payload[:min(len(payload), p2p.BlockSize)])
	n.refStep(step, hs)
	if err := n.store(ctx, bs); err != nil {
		return p2p.Announcement{}, err
	}
	a := p2p.Announcement{
		RunID: *n.cfg.runID, Step: step, Batch: batch,
		Trainer:    coordinator.ClientID{Signer: n.signer},
		Commitment: p2p.Commitment(step, batch, payload), Blob: ref,
		Nonce: n.nonce.Add(1),
	}
	return a, n.topic.Publish(ctx, a.SignUnchecked(n.key))
}
