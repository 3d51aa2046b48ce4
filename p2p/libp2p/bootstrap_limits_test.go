package libp2p

import (
	"context"
	"fmt"
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
func stranger(t *testing.T) host.Host { return strangerWith(t, golibp2p.NoListenAddrs) }

// strangerFrom is a stranger whose connections come from the loopback
// address ip: it listens there, and libp2p's TCP transport dials a
// loopback address from its loopback listener's address.
func strangerFrom(t *testing.T, ip string) host.Host {
	return strangerWith(t, golibp2p.ListenAddrStrings("/ip4/"+ip+"/tcp/0"))
}

func strangerWith(t *testing.T, listen golibp2p.Option) host.Host {
	t.Helper()
	h, err := golibp2p.New(listen, golibp2p.Transport(tcp.NewTCPTransport), golibp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// limitedBootstrap is an open bootstrap host on 127.0.0.1 with these
// connection caps (per address, in all) and idle timeout, its address, and
// a context that bounds the test.
func limitedBootstrap(t *testing.T, name string, perAddr, total int, idle time.Duration) (*Bootstrap, peer.AddrInfo, context.Context) {
	t.Helper()
	b, err := NewBootstrap(WithKey(testKey(name)), WithListenAddrs("/ip4/127.0.0.1/tcp/0"), WithOpenRelay(),
		WithConnLimits(perAddr, total), WithIdleTimeout(idle), limitLoopback())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return b, peer.AddrInfo{ID: b.host.ID(), Addrs: b.host.Addrs()}, ctx
}

// A bootstrap host open to anyone holds at most its per-address cap of
// connections from one address, closes the ones that sit idle, and keeps a
// reserved peer's however idle it is.
func TestBootstrapBoundsConnections(t *testing.T) {
	b, ai, ctx := limitedBootstrap(t, "bounded", 3, 64, time.Second)

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

// A bootstrap host whose connections in all are taken by several
// addresses still admits a fresh address: its connection takes the place
// of the oldest one of the address that holds the most, and a lighter
// address keeps its own. Before, the fresh address was refused for as long
// as the others held on.
func TestBootstrapShedsTheHeaviestAddress(t *testing.T) {
	b, ai, ctx := limitedBootstrap(t, "heaviest", 3, 4, time.Hour)
	// Each connection is counted before the next is made: the oldest is
	// the first.
	connect := func(ip string, count int) host.Host {
		h := strangerFrom(t, ip)
		if err := h.Connect(ctx, ai); err != nil {
			t.Fatalf("a connection from %s: %v", ip, err)
		}
		waitFor(t, ctx, fmt.Sprintf("%d connections counted", count), func() bool { n, _ := b.caps.pool.Len(""); return n == count })
		return h
	}
	var heavy []host.Host
	for i := range 3 {
		heavy = append(heavy, connect("127.0.0.2", i+1))
	}
	light := connect("127.0.0.3", 4)
	fresh := connect("127.0.0.4", 4)
	// The oldest of the heaviest address's goes, and nothing else.
	waitFor(t, ctx, "the heaviest address's oldest connection closed", func() bool {
		return b.host.Network().Connectedness(heavy[0].ID()) != network.Connected
	})
	for _, h := range append(heavy[1:], light, fresh) {
		if b.host.Network().Connectedness(h.ID()) != network.Connected {
			t.Errorf("%s's connection was closed", h.Addrs())
		}
	}
	if shed, _ := b.caps.pool.Counts(); shed != 1 {
		t.Errorf("%d connections shed, want 1", shed)
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
