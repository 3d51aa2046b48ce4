package libp2p

import (
	"errors"
	"testing"

	"github.com/psyche-go/psyche/p2p"
)

// verifyOnce checks a signature once per encoding: the same bytes again
// are taken without a second check, other bytes (a flipped signature) are
// checked and refused and never remembered, and the table stays bounded.
func TestVerifyOnce(t *testing.T) {
	n := &Node{}
	n.step.Store(100)
	sign := func(step uint32, nonce uint64) ([]byte, p2p.Announcement) {
		a := p2p.Announcement{RunID: testRun, Step: step, Batch: p2p.BatchRange{Start: 0, End: 1},
			Commitment: p2p.Commitment(step, p2p.BatchRange{Start: 0, End: 1}, []byte("x")), Nonce: nonce}
		if err := a.Sign(testKey("alice")); err != nil {
			t.Fatal(err)
		}
		b, err := a.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b, a
	}
	b, a := sign(100, 1)
	if err := n.verifyOnce(b, &a); err != nil {
		t.Fatal(err)
	}
	if len(n.verified) != 1 {
		t.Fatalf("%d digests after one announcement", len(n.verified))
	}
	if err := n.verifyOnce(b, &a); err != nil || len(n.verified) != 1 {
		t.Fatalf("the same bytes again: %v, %d digests", err, len(n.verified))
	}
	bad := append([]byte(nil), b...)
	bad[len(bad)-1] ^= 1 // the signature's last byte
	ab, err := p2p.DecodeAnnouncement(bad)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := n.verifyOnce(bad, &ab); !errors.Is(err, p2p.ErrBadSignature) {
			t.Fatalf("a flipped signature: %v", err)
		}
	}
	if len(n.verified) != 1 {
		t.Fatalf("a refused announcement was remembered (%d digests)", len(n.verified))
	}
	// Once the table is full, the steps that left the window go; the
	// window's stay.
	for i := 1; len(n.verified) < maxVerified; i++ {
		b, a := sign(90, uint64(i+1)) // step 90: outside the window of step 100
		if err := n.verifyOnce(b, &a); err != nil {
			t.Fatal(err)
		}
	}
	b, a = sign(101, 1)
	if err := n.verifyOnce(b, &a); err != nil {
		t.Fatal(err)
	}
	if len(n.verified) != 2 {
		t.Fatalf("%d digests after pruning, want the window's 2", len(n.verified))
	}
}
