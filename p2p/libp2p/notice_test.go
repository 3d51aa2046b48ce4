package libp2p

import (
	"context"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pubsubpb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// The validator judges a notice as it judges an announcement: a forged,
// oversized, malformed or other run's notice is rejected (the sender's
// gossip score pays for it), one outside this node's view (another
// trainer's batch, a step out of the window) or a replay is ignored, and an
// honest one is accepted and handed to the trainer once however often it
// is re-sent.
func TestValidatorJudgesNotices(t *testing.T) {
	alice, mallory := clientIDOf("alice"), clientIDOf("mallory")
	c := startNode(t, "carol", WithReannounceInterval(0))
	c.SetClients([]coordinator.ClientID{alice, clientIDOf("carol"), mallory})
	c.SetAssignments(assignments(8, 11, alice, mallory))
	c.SetStep(10)
	lk, err := crypto.UnmarshalEd25519PrivateKey(testKey("mallory"))
	if err != nil {
		t.Fatal(err)
	}
	from, err := peer.IDFromPrivateKey(lk)
	if err != nil {
		t.Fatal(err)
	}
	nonce := uint64(0)
	signed := func(by string, no p2p.Notice) []byte {
		nonce++
		no.Nonce = nonce
		if err := no.Sign(testKey(by)); err != nil {
			t.Fatal(err)
		}
		b, err := no.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	notice := func(step uint32, start uint64, who coordinator.ClientID, run string) p2p.Notice {
		return p2p.Notice{RunID: run, Step: step, Batch: p2p.BatchRange{Start: start, End: start + 1}, Trainer: who}
	}
	judge := func(data []byte) (pubsub.ValidationResult, *pubsub.Message) {
		m := &pubsub.Message{Message: &pubsubpb.Message{Data: data}, ReceivedFrom: from}
		return c.validate(context.Background(), from, m), m
	}
	forged := signed("mallory", notice(10, 0, alice, testRun))
	copy(forged[2+len(testRun)+54:], alice.P2P[:]) // alice's key, mallory's signature
	oversize := make([]byte, p2p.MaxNoticeSize+1)
	oversize[0] = signed("mallory", notice(10, 1, mallory, testRun))[0] // a notice's kind
	for _, tc := range []struct {
		name   string
		data   []byte
		want   pubsub.ValidationResult
		reason string
	}{
		{"forged signature", forged, pubsub.ValidationReject, "bad_signature"},
		{"another run", signed("mallory", notice(10, 1, mallory, "other-run")), pubsub.ValidationReject, "wrong_run"},
		{"oversize", oversize, pubsub.ValidationReject, "oversize"},
		{"cut short", []byte{16, 3, 'a'}, pubsub.ValidationReject, "malformed"},
		{"unassigned batch", signed("mallory", notice(10, 0, mallory, testRun)), pubsub.ValidationIgnore, "not_assigned"},
		{"stale step", signed("mallory", notice(7, 1, mallory, testRun)), pubsub.ValidationIgnore, "step_window"},
	} {
		before := c.Stats()
		if got, _ := judge(tc.data); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		// Counted as a refused notice, not as a refused announcement.
		after := c.Stats()
		if after.NoticesRejected[tc.reason] != before.NoticesRejected[tc.reason]+1 || after.Rejected[tc.reason] != before.Rejected[tc.reason] {
			t.Errorf("%s: %d refused notices and %d refused announcements counted as %s, want one notice",
				tc.name, after.NoticesRejected[tc.reason]-before.NoticesRejected[tc.reason], after.Rejected[tc.reason]-before.Rejected[tc.reason], tc.reason)
		}
	}
	honest := signed("mallory", notice(10, 1, mallory, testRun))
	got, m := judge(honest)
	no, ok := m.ValidatorData.(p2p.Notice)
	if got != pubsub.ValidationAccept || !ok || no.Trainer != mallory || no.Step != 10 {
		t.Fatalf("an honest notice: %v, %+v", got, m.ValidatorData)
	}
	if again, _ := judge(honest); again != pubsub.ValidationIgnore || c.Stats().NoticesRejected["replayed"] != 1 {
		t.Errorf("the same bytes again: %v (%d counted as replayed notices), want ignored as a replay", again, c.Stats().NoticesRejected["replayed"])
	}
	// Delivered once per trainer, step and batch: a re-sent copy (another
	// nonce) is relayed but not handed over again.
	c.handOverNotice(no)
	resent, m2 := judge(signed("mallory", notice(10, 1, mallory, testRun)))
	if resent != pubsub.ValidationAccept {
		t.Fatalf("a re-sent notice: %v", resent)
	}
	c.handOverNotice(m2.ValidatorData.(p2p.Notice))
	select {
	case got := <-c.Notices():
		if got != no {
			t.Fatalf("delivered %+v, want %+v", got, no)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the notice was not delivered")
	}
	select {
	case got := <-c.Notices():
		t.Fatalf("delivered twice: %+v", got)
	default:
	}
}

// A node re-sends its notice of the current round until it publishes the
// round's result: a peer whose view had not reached the round when the
// first came (and so ignored it) hears of it on the next.
func TestNoticeResentUntilPublished(t *testing.T) {
	ns := startCluster(t, 2, WithReannounceInterval(200*time.Millisecond))
	a, b := ns[0], ns[1]
	ids := []coordinator.ClientID{clientIDOf(a.name), clientIDOf(b.name)}
	a.SetClients(ids)
	b.SetClients(ids)
	a.SetAssignments(assignments(4, 6, ids...))
	a.SetStep(5)
	// b's view lags: round 5 is not assigned yet.
	b.SetAssignments(assignments(3, 4, ids...))
	b.SetStep(4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	batch := p2p.BatchRange{Start: 0, End: 1}
	if err := a.Notify(ctx, 5, batch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "b ignoring the notice its view does not assign", func() bool {
		return b.Stats().NoticesRejected["not_assigned"] > 0
	})
	b.SetAssignments(assignments(4, 6, ids...))
	b.SetStep(5)
	select {
	case no := <-b.Notices():
		if no.Trainer != ids[0] || no.Step != 5 || no.Batch != batch {
			t.Fatalf("got %+v", no)
		}
	case <-ctx.Done():
		t.Fatal("the notice was never re-sent")
	}
	if _, err := a.Publish(ctx, 5, batch, []byte("a's result")); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	left := len(a.ownNotices)
	a.mu.Unlock()
	if left != 0 {
		t.Errorf("%d notices still re-sent after the result was published", left)
	}
}
