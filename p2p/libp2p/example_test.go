package libp2p_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/p2p/libp2p"
)

// Two trainers of one epoch exchange a result: one publishes, the other
// receives the announcement and fetches the payload, checked against the
// commitment.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := func(name string) ed25519.PrivateKey {
		seed := sha256.Sum256([]byte(name))
		return ed25519.NewKeyFromSeed(seed[:])
	}
	id := func(k ed25519.PrivateKey) coordinator.ClientID {
		var c coordinator.ClientID
		copy(c.P2P[:], k.Public().(ed25519.PublicKey))
		return c
	}
	ka, kb := key("alice"), key("bob")
	epoch := []coordinator.ClientID{id(ka), id(kb)} // from the coordinator's snapshot
	var nodes []*libp2p.Node
	for _, k := range []ed25519.PrivateKey{ka, kb} {
		n, err := libp2p.New(libp2p.WithRunID("example"), libp2p.WithKey(k),
			libp2p.WithListenAddrs("/ip4/127.0.0.1/tcp/0"))
		if err != nil {
			panic(err)
		}
		n.SetClients(epoch)
		n.SetStep(1)
		go n.Run(ctx)
		nodes = append(nodes, n)
	}
	alice, bob := nodes[0], nodes[1]
	if err := bob.Connect(ctx, alice.Addrs()[0]); err != nil {
		panic(err)
	}
	// Gossip may lose a message published before the mesh forms; a trainer
	// that misses one pulls it. Here bob pulls until alice's is there.
	if _, err := alice.Publish(ctx, 1, p2p.BatchRange{Start: 0, End: 8}, []byte("alice's gradients")); err != nil {
		panic(err)
	}
	var got p2p.Announcement
	for got.Step == 0 {
		select {
		case got = <-bob.Announcements():
		case <-time.After(100 * time.Millisecond):
			if as, _ := bob.Pull(ctx, 1); len(as) > 0 {
				got = as[0]
			}
		}
	}
	payload, err := bob.Fetch(ctx, got)
	if err != nil {
		panic(err)
	}
	fmt.Printf("step %d batch [%d,%d): %s\n", got.Step, got.Batch.Start, got.Batch.End, payload)
	// Output: step 1 batch [0,8): alice's gradients
}
