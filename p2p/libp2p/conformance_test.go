package libp2p

import (
	"context"
	"crypto/ed25519"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/p2p/p2ptest"
)

func TestConformance(t *testing.T) {
	p2ptest.Run(t, p2ptest.Harness{New: func(t *testing.T, key ed25519.PrivateKey, signer coordinator.Pubkey) p2p.Network {
		n, err := New(WithRunID(p2ptest.RunID), WithKey(key), WithSigner(signer), loopback())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = n.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return n
	}})
}
