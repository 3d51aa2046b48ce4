// Package start wires a trainer: its libp2p network (p2p/libp2p) and its
// client node (trainer/node) over it. It is the one place under trainer/
// that knows libp2p (internal/archtest checks it); psyche join, localnet and
// the end-to-end tests use it.
package start

import (
	"context"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/trainer/node"
)

// Trainer creates a trainer: its libp2p node for the run (p2pOpts add the
// key, listen addresses, logger and metrics; the run id and signer come from
// here), which runs until ctx ends, and the client node over it. Run the
// returned node to train.
func Trainer(ctx context.Context, runID string, backend chain.Backend, signer chain.Signer, p2pOpts []libp2p.Option, opts ...node.Option) (*node.Node, *libp2p.Node, error) {
	pn, err := libp2p.New(append([]libp2p.Option{libp2p.WithRunID(runID), libp2p.WithSigner(signer.Public())}, p2pOpts...)...)
	if err != nil {
		return nil, nil, err
	}
	nd, err := node.New(runID, backend, signer, pn, opts...)
	if err != nil {
		_ = pn.Close()
		return nil, nil, err
	}
	go func() { _ = pn.Run(ctx) }()
	return nd, pn, nil
}
