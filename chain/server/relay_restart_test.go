package server

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p/libp2p"
)

// TestRestartedTrainerGetsItsRelayReservation: a trainer that stopped,
// was dropped by a health check and restarted with its own key (so its
// own p2p identity) gets its reservation on the server's relay back at
// once. The relay admitted the epoch's clients and joiners alone, and a
// dropped trainer is neither until it joins again, after the epoch: the
// relay answered PERMISSION_DENIED meanwhile, and the trainer warned.
func TestRestartedTrainerGetsItsRelayReservation(t *testing.T) {
	seed := func(name string) ed25519.PrivateKey {
		s := sha256.Sum256([]byte("relay restart test " + name))
		return ed25519.NewKeyFromSeed(s[:])
	}
	relay, err := libp2p.NewBootstrap(libp2p.WithKey(seed("relay")), libp2p.WithListenAddrs("/ip4/127.0.0.1/tcp/0"), libp2p.WithRelayService())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	s, err := New(t.TempDir(), WithP2P(relay))
	if err != nil {
		t.Fatal(err)
	}
	key := seed("trainer")
	client := func(name string, k ed25519.PrivateKey, st coordinator.ClientState) coordinator.Client {
		c := coordinator.Client{ID: coordinator.ClientID{Signer: coordinator.Pubkey(sha256.Sum256([]byte(name)))}, State: st, ExitedHeight: 1}
		copy(c.ID.P2P[:], k.Public().(ed25519.PublicKey))
		return c
	}
	me, alice, bob := client("me", key, coordinator.Healthy), client("alice", seed("alice"), coordinator.Healthy), client("bob", seed("bob"), coordinator.Healthy)
	dropped := me
	dropped.State = coordinator.Dropped
	for _, tc := range []struct {
		name            string
		clients, exited []coordinator.Client
	}{
		// The first life: a member of the epoch in progress.
		{"a member", []coordinator.Client{me, alice, bob}, nil},
		// Stopped, dropped at round 1 and moved to the exited list (after
		// the epoch before's members); alice and bob train on.
		{"restarted after its drop", []coordinator.Client{alice, bob}, []coordinator.Client{me, alice, bob, dropped}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &coordinator.Coordinator{RunState: coordinator.RoundTrain}
			st.Epoch.ClientsLen = uint16(copy(st.Epoch.Clients[:], tc.clients))
			st.Epoch.ExitedLen = uint16(copy(st.Epoch.Exited[:], tc.exited))
			s.setMembers("tiny", st)
			n, err := libp2p.New(libp2p.WithRunID("tiny"), libp2p.WithKey(key), libp2p.WithListenAddrs("/ip4/127.0.0.1/tcp/0"),
				libp2p.WithRelays(relay.Addrs()...))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- n.Run(ctx) }()
			defer func() { cancel(); <-done }()
			// A generous bound on the wait: the reservation is granted at
			// the first try on a healthy machine, and never when refused.
			deadline := time.Now().Add(90 * time.Second)
			for !relayed(n.Addrs()) {
				if time.Now().After(deadline) {
					t.Fatalf("no reservation on the relay: the trainer's addresses are %v", n.Addrs())
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// relayed says whether addrs hold a relayed address: the node holds a
// reservation.
func relayed(addrs []string) bool {
	for _, a := range addrs {
		if strings.Contains(a, "/p2p-circuit") {
			return true
		}
	}
	return false
}
