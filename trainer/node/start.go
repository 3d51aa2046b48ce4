package node

import (
	"context"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/p2p"
)

// Start creates a trainer: its libp2p node for the run (p2pOpts add the key,
// listen addresses, logger and metrics; the run id and signer come from here),
// which runs until ctx ends, and the client node over it. Run the returned
// Node to train. It is the one place a trainer's network and node are wired
// together (psyche join, localnet and the tests use it).
func Start(ctx context.Context, runID string, backend chain.Backend, signer chain.Signer, p2pOpts []p2p.Option, opts ...Option) (*Node, *p2p.Node, error) {
	pn, err := p2p.New(append([]p2p.Option{p2p.WithRunID(runID), p2p.WithSigner(signer.Public())}, p2pOpts...)...)
	if err != nil {
		return nil, nil, err
	}
	nd, err := New(runID, backend, signer, pn, opts...)
	if err != nil {
		_ = pn.Close()
		return nil, nil, err
	}
	go func() { _ = pn.Run(ctx) }()
	return nd, pn, nil
}
