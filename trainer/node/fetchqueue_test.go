package node

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// TestFetchRingOrder: a node fetches a step's results in the ring order of
// the epoch's p2p keys starting after its own, maxFetches at a time, from
// the window after those it has fetched (an announcer past it waits even
// when it announced first), until ringPatience lets a waiting one through;
// older steps go first, and an announcer the node does not know as a client
// is not held back.
func TestFetchRingOrder(t *testing.T) {
	key := func(pos uint64) coordinator.Pubkey {
		var k coordinator.Pubkey
		binary.LittleEndian.PutUint64(k[:8], pos)
		return k
	}
	const n = 40
	self := key(1050)
	var clients []coordinator.Client
	for i := range n {
		clients = append(clients, coordinator.Client{ID: coordinator.ClientID{P2P: key(uint64(i) * 100)}})
	}
	clients = append(clients, coordinator.Client{ID: coordinator.ClientID{P2P: self}})
	ann := func(step uint32, pos uint64) p2p.Announcement {
		a := p2p.Announcement{Step: step}
		a.Trainer.P2P = key(pos)
		binary.LittleEndian.PutUint64(a.Commitment[:8], pos)
		a.Commitment[8] = byte(step)
		return a
	}
	var q fetchQueue
	q.setRing(self, clients)
	// Everyone announces, in the order of their keys (the same order at
	// every node: the first announcers would get every node's fetches).
	for i := range n {
		q.waiting = append(q.waiting, ann(5, uint64(i)*100))
	}
	now := time.Unix(100, 0)
	got := q.take(now)
	if len(got) != maxFetches {
		t.Fatalf("started %d fetches, want %d", len(got), maxFetches)
	}
	for i, a := range got {
		// After 1050 on the ring: 1100, 1200, …
		if want := key(uint64(11+i) * 100); a.Trainer.P2P != want {
			t.Fatalf("fetch %d goes to %x, want %x", i, a.Trainer.P2P[:8], want[:8])
		}
	}
	// A fetch ends: the window moves by one, and the next on the ring starts.
	q.finished(got[0])
	if next := q.take(now); len(next) != 1 || next[0].Trainer.P2P != key(27*100) {
		t.Fatalf("after one fetch ended: %v", next)
	}
	// Slots free without the window moving (fetches of another step end):
	// nobody past the window starts until ringPatience has passed.
	q.inFlight -= 5
	if next := q.take(now.Add(ringPatience - time.Millisecond)); len(next) != 0 {
		t.Fatalf("%d fetches past the window started before ringPatience", len(next))
	}
	if next := q.take(now.Add(ringPatience)); len(next) != 5 {
		t.Fatalf("after ringPatience: %d fetches started, want 5", len(next))
	}
	// An older step goes first.
	q.inFlight = 0
	q.perPeer = map[coordinator.Pubkey]int{}
	q.waiting = append(q.waiting, ann(4, 1100))
	if first := q.take(now.Add(ringPatience)); len(first) == 0 || first[0].Step != 4 {
		t.Fatalf("the older step's fetch did not go first: %v", first)
	}
	// An announcer this node does not know as a client has no place to
	// wait for.
	q = fetchQueue{}
	q.setRing(self, clients)
	q.waiting = []p2p.Announcement{ann(7, 12345)}
	if got := q.take(now); len(got) != 1 {
		t.Fatal("an announcer that is not a known client was held back")
	}
}
