package libp2p

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/promread"
	"github.com/psyche-go/psyche/p2p"
)

// startBootstrap starts a bootstrap host on loopback serving testRun's DHT
// for the given members (and relaying for them with relay).
func startBootstrap(t testing.TB, relay bool, members ...coordinator.ClientID) *Bootstrap {
	t.Helper()
	opts := []Option{WithKey(testKey("bootstrap")), loopback()}
	if relay {
		opts = append(opts, WithRelayService())
	}
	b, err := NewBootstrap(opts...)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]coordinator.Pubkey, len(members))
	for i, m := range members {
		keys[i] = m.P2P
	}
	b.SetRuns(map[string][]coordinator.Pubkey{testRun: keys})
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// Trainers that know only the bootstrap host find each other through the
// run's DHT and exchange a result.
func TestDiscoveryThroughBootstrap(t *testing.T) {
	ids := []coordinator.ClientID{clientIDOf("d1"), clientIDOf("d2"), clientIDOf("d3")}
	b := startBootstrap(t, false, ids...)
	var nodes []*testNode
	for _, name := range []string{"d1", "d2", "d3"} {
		nd := startNode(t, name, WithBootstrapPeers(b.Addrs()...))
		nd.SetClients(ids)
		nd.SetStep(1)
		nodes = append(nodes, nd)
	}
	eventually(t, 60*time.Second, "every trainer connected to the other two", func() bool {
		for _, nd := range nodes {
			paths := nd.Paths()
			for _, other := range nodes {
				if other != nd && paths[other.ID()] != PathDirect {
					return false
				}
			}
		}
		return true
	})
	waitTopicPeers(t, nodes, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	payload := randomBytes(3, 200_000)
	if _, err := nodes[0].Publish(ctx, 1, p2p.BatchRange{Start: 0, End: 1}, payload); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes[1:] {
		as, err := collect(ctx, nd, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := nd.Fetch(ctx, as[0]); err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("%s: fetch: %v", nd.name, err)
		}
	}
}

// Trainers that cannot dial each other (they listen nowhere) reach each
// other through the relay, and results still move.
func TestRelayedWhenTheOnlyPath(t *testing.T) {
	ids := []coordinator.ClientID{clientIDOf("r1"), clientIDOf("r2")}
	b := startBootstrap(t, true, ids...)
	open := startNodeWith(t, "r1", WithRelays(b.Addrs()...), WithListenAddrs())
	hidden := startNodeWith(t, "r2", WithRelays(b.Addrs()...), WithListenAddrs())
	for _, nd := range []*testNode{open, hidden} {
		nd.SetClients(ids)
		nd.SetStep(1)
	}
	eventually(t, 60*time.Second, "a relayed connection between the two", func() bool {
		return open.Paths()[hidden.ID()] != "" && hidden.Paths()[open.ID()] != ""
	})
	waitTopicPeers(t, []*testNode{open, hidden}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	payload := randomBytes(4, 600_000)
	if _, err := hidden.Publish(ctx, 1, p2p.BatchRange{Start: 0, End: 1}, payload); err != nil {
		t.Fatal(err)
	}
	as, err := collect(ctx, open, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := open.Fetch(ctx, as[0]); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("fetch through the relay: %v", err)
	}
	// Neither listens, so whatever connects the two runs through the relay
	// (hole punching needs an address to punch to).
	if p := open.Paths()[hidden.ID()]; p != PathRelayed {
		t.Errorf("path to the hidden node: %q, want %q", p, PathRelayed)
	}
	if v := promread.Value(open.m.Paths.WithLabelValues(PathRelayed)); v < 1 {
		t.Errorf("relayed peers gauge: %v", v)
	}
}

// The relay of a server refuses peers that are not members of its runs,
// also when it has no runs (B8: a nil member list meant anyone, and a
// stranger reserved a slot and relayed 64 MiB through a server with no
// runs); only an open relay (psyche relay) serves anyone.
func TestRelayRefusesStrangers(t *testing.T) {
	b := startBootstrap(t, true, clientIDOf("m1"))
	m1, stranger := peerIDMust(t, clientIDOf("m1").P2P), peerIDMust(t, clientIDOf("stranger").P2P)
	if !b.member(m1) || b.member(stranger) {
		t.Error("membership does not follow SetRuns")
	}
	for _, tc := range []struct {
		name string
		runs map[string][]coordinator.Pubkey
	}{
		{"no runs", map[string][]coordinator.Pubkey{}},
		{"nil runs", nil},
		{"a run without members", map[string][]coordinator.Pubkey{testRun: nil}},
	} {
		b.SetRuns(tc.runs)
		if b.member(m1) || b.member(stranger) {
			t.Errorf("%s: the relay serves a peer that is no member", tc.name)
		}
		if acl := (relayACL{b}); acl.AllowReserve(stranger, nil) || acl.AllowConnect(stranger, nil, m1) {
			t.Errorf("%s: the relay's ACL admits a stranger", tc.name)
		}
	}
	open, err := NewBootstrap(WithKey(testKey("open")), loopback(), WithOpenRelay())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	open.SetRuns(map[string][]coordinator.Pubkey{testRun: nil})
	if !open.Relay() || !open.member(stranger) {
		t.Error("an open relay refuses a stranger")
	}
	// Its operator's bound: the reservations it holds at once.
	c, err := applyOptions([]Option{WithRelayReservations(10, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if r := relayResources(c); r.MaxReservations != 10 || r.MaxReservationsPerIP != 2 || r.MaxReservationsPerASN != 10 {
		t.Errorf("resources %+v", r)
	}
	if _, err := applyOptions([]Option{WithRelayReservations(0, 2)}); err == nil {
		t.Error("no reservations at all was accepted")
	}
	if !strings.HasPrefix(string(DHTPrefix(testRun)), "/psyche/run/") {
		t.Errorf("DHT prefix %q", DHTPrefix(testRun))
	}
}

func peerIDMust(t testing.TB, k coordinator.Pubkey) peer.ID {
	t.Helper()
	p, err := peerIDOf(k)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Two trainers on one network find each other by mDNS alone (no bootstrap).
func TestMDNSDiscovery(t *testing.T) {
	ids := []coordinator.ClientID{clientIDOf("m1"), clientIDOf("m2")}
	a := startNode(t, "m1", WithMDNS())
	b := startNode(t, "m2", WithMDNS())
	for _, nd := range []*testNode{a, b} {
		nd.SetClients(ids)
	}
	eventually(t, 60*time.Second, "the two connected", func() bool { return a.Paths()[b.ID()] != "" })
}

// When the relay in use disappears, trainers that can only meet through a
// relay move to the other one, and results move again.
func TestRelayDisappears(t *testing.T) {
	ids := []coordinator.ClientID{clientIDOf("x1"), clientIDOf("x2")}
	keys := []coordinator.Pubkey{ids[0].P2P, ids[1].P2P}
	relay := func(name string) *Bootstrap {
		b, err := NewBootstrap(WithKey(testKey(name)), loopback(), WithRelayService())
		if err != nil {
			t.Fatal(err)
		}
		b.SetRuns(map[string][]coordinator.Pubkey{testRun: keys})
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	r1, r2 := relay("relay1"), relay("relay2")
	relays := append(r1.Addrs(), r2.Addrs()...)
	x1 := startNodeWith(t, "x1", WithRelays(relays...), WithListenAddrs())
	x2 := startNodeWith(t, "x2", WithRelays(relays...), WithListenAddrs())
	for _, nd := range []*testNode{x1, x2} {
		nd.SetClients(ids)
		nd.SetStep(1)
	}
	eventually(t, 60*time.Second, "a relayed connection", func() bool { return x1.Paths()[x2.ID()] == PathRelayed })
	// Take down whichever relay carries the connection (both, in turn, if
	// it moves before we look).
	down := r1
	for _, c := range x1.host.Network().ConnsToPeer(x2.host.ID()) {
		if strings.Contains(c.RemoteMultiaddr().String(), r2.ID()) {
			down = r2
		}
	}
	_ = down.Close()
	eventually(t, 90*time.Second, "a connection through the other relay", func() bool {
		for _, c := range x1.host.Network().ConnsToPeer(x2.host.ID()) {
			if !strings.Contains(c.RemoteMultiaddr().String(), down.ID()) {
				return true
			}
		}
		return false
	})
	waitTopicPeers(t, []*testNode{x1, x2}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	payload := randomBytes(5, 300_000)
	if _, err := x2.Publish(ctx, 1, p2p.BatchRange{Start: 0, End: 1}, payload); err != nil {
		t.Fatal(err)
	}
	as, err := collect(ctx, x1, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := x1.Fetch(ctx, as[0]); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("fetch through the remaining relay: %v", err)
	}
}
