package memnet_test

import (
	"crypto/ed25519"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/p2p/memnet"
	"github.com/psyche-go/psyche/p2p/p2ptest"
)

func TestConformance(t *testing.T) {
	hub := memnet.NewHub()
	p2ptest.Run(t, p2ptest.Harness{New: func(t *testing.T, key ed25519.PrivateKey, signer coordinator.Pubkey) p2p.Network {
		n := hub.Join(p2ptest.RunID, key, signer)
		t.Cleanup(n.Close)
		return n
	}})
}
