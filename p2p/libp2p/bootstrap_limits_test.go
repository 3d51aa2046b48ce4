package libp2p

import (
	"context"
	"testing"
	"time"

	golibp2p "github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
)

// limitLoopback lifts libp2p's exemption of loopback addresses from the
// per-address cap: a test has no other address to connect from.
func limitLoopback() Option {
	return func(c *config) error { c.limitLoopback = true; return nil }
}

// stranger is a plain libp2p host (not psyche's) that dials out over TCP.
func stranger(t *testing.T) host.Host {
	t.Helper()
	h, err := golibp2p.New(golibp2p.NoListenAddrs, golibp2p.Transport(tcp.NewTCPTransport), golibp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// A bootstrap host open to anyone holds at most its per-address cap of
// connections from one address, closes the ones that sit idle, and keeps a
// reserved peer's however idle it is.
func TestBootstrapBoundsConnections(t *testing.T) {
	b, err := NewBootstrap(WithKey(testKey("bounded")), WithListenAddrs("/ip4/127.0.0.1/tcp/0"), WithOpenRelay(),
		WithConnLimits(3, 64), WithIdleTimeout(time.Second), limitLoopback())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ai := peer.AddrInfo{ID: b.host.ID(), Addrs: b.host.Addrs()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The cap: three connections from 127.0.0.1, the fourth refused.
	var held []host.Host
	for i := range 3 {
		h := stranger(t)
		if err := h.Connect(ctx, ai); err != nil {
			t.Fatalf("connection %d within the cap: %v", i+1, err)
		}
		held = append(held, h)
	}
	if err := stranger(t).Connect(ctx, ai); err == nil {
		t.Fatal("a fourth connection from one address was accepted (cap 3)")
	}

	// Idle: the three do nothing and are closed; one reserves a slot on the
	// relay first and stays.
	if _, err := client.Reserve(ctx, held[0], ai); err != nil {
		t.Fatalf("reservation: %v", err)
	}
	for _, h := range held[1:] {
		waitFor(t, ctx, "the idle connection closed", func() bool {
			return b.host.Network().Connectedness(h.ID()) != network.Connected
		})
	}
	if b.host.Network().Connectedness(held[0].ID()) != network.Connected {
		t.Error("the reserved peer's idle connection was closed with the others")
	}
	// Room again for a newcomer.
	if err := stranger(t).Connect(ctx, ai); err != nil {
		t.Errorf("a newcomer after the idle ones left: %v", err)
	}
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting: %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
