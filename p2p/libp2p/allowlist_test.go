package libp2p

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

func TestAllowlistRefusesStrangers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := clientIDOf("a"), clientIDOf("b")
	nb := startNode(t, "b")
	nb.SetClients([]coordinator.ClientID{a, b})
	// b is a's bootstrap peer: dialled at start, allowed whatever the epoch.
	na := startNode(t, "a", WithBootstrapPeers(nb.Addrs()[0]))
	na.SetClients([]coordinator.ClientID{a})
	eventually(t, 30*time.Second, "a connected to its bootstrap peer", func() bool {
		return slices.Contains(na.Peers(), nb.ID())
	})

	// A stranger that allows a cannot get in; a cannot dial it either.
	stranger := startNode(t, "stranger")
	stranger.SetClients([]coordinator.ClientID{a, clientIDOf("stranger")})
	var admitted atomic.Bool
	na.host.Network().Notify(&network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) {
		if k, _ := pubkeyOf(c.RemotePeer()); k == stranger.ID() && !na.gate.allowed(c.RemotePeer()) {
			admitted.Store(true)
		}
	}})
	// The dialler may finish its side of the handshake before a refuses at
	// the secured stage, so Connect can return nil; what matters is that a
	// never admits the connection and the stranger is left with nothing.
	_ = stranger.Connect(ctx, na.Addrs()[0])
	eventually(t, 30*time.Second, "the stranger's connection closed", func() bool {
		return stranger.host.Network().Connectedness(na.host.ID()) != network.Connected
	})
	if _, err := stranger.host.NewStream(ctx, na.host.ID(), p2p.PullProtocol); err == nil {
		t.Error("the stranger opened a stream to a")
	}
	if err := na.Connect(ctx, stranger.Addrs()[0]); err == nil {
		t.Error("a dialled a peer outside the allowlist")
	}
	if admitted.Load() || slices.Contains(na.Peers(), stranger.ID()) {
		t.Fatal("a admitted a connection from outside the allowlist")
	}

	// Once the stranger joins the epoch it may connect; when the epoch moves
	// on without it, the connection is dropped — but not the bootstrap peer's.
	na.SetClients([]coordinator.ClientID{a, clientIDOf("stranger")})
	if err := stranger.Connect(ctx, na.Addrs()[0]); err != nil {
		t.Fatalf("a client of the epoch could not connect: %v", err)
	}
	na.SetClients([]coordinator.ClientID{a})
	eventually(t, 30*time.Second, "the former client disconnected", func() bool {
		return !slices.Contains(na.Peers(), stranger.ID())
	})
	if !slices.Contains(na.Peers(), nb.ID()) {
		t.Error("the bootstrap peer was disconnected")
	}
}
