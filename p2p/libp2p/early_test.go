package libp2p

import (
	"context"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// A trainer that sees a round start before its peers do publishes a result
// for a step their views have not reached: each peer keeps it until its own
// view does, then delivers it if the batch is the trainer's, and refuses it
// as unassigned if not.
func TestEarlyAnnouncementWaitsForTheView(t *testing.T) {
	alice, carol := clientIDOf("alice"), clientIDOf("carol")
	ids := []coordinator.ClientID{alice, carol}
	a := startNode(t, "alice", WithReannounceInterval(0))
	c := startNode(t, "carol")
	for _, nd := range []*testNode{a, c} {
		nd.SetClients(ids)
		nd.SetAssignments(assignments(8, 10, alice, carol))
		nd.SetStep(10)
	}
	connectAll(t, []*testNode{a, c})
	waitTopicPeers(t, []*testNode{a, c}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Alice has moved to step 11; carol has not.
	a.SetStep(11)
	a.SetAssignments(assignments(9, 11, alice, carol))
	mine, err := a.Publish(ctx, 11, p2p.BatchRange{Start: 0, End: 1}, []byte("alice's step 11"))
	if err != nil {
		t.Fatal(err)
	}
	// Batch 1 of step 11 is carol's: alice has no business announcing it.
	if _, err := a.Publish(ctx, 11, p2p.BatchRange{Start: 1, End: 2}, []byte("not alice's batch")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "carol keeping both early announcements", func() bool { return c.Stats().Early == 2 })
	if st := c.Stats(); st.Delivered != 0 || st.Rejected["not_assigned"] != 0 {
		t.Fatalf("before carol's view moved: %d delivered, %d refused as unassigned; want none", st.Delivered, st.Rejected["not_assigned"])
	}
	select {
	case got := <-c.Announcements():
		t.Fatalf("delivered before the view reached step 11: %+v", got.Batch)
	default:
	}

	// Carol's view reaches step 11: alice's own batch is delivered, the
	// other refused.
	c.SetStep(11)
	c.SetAssignments(assignments(9, 11, alice, carol))
	select {
	case got := <-c.Announcements():
		if got.Commitment != mine.Commitment {
			t.Fatalf("delivered batch %+v, want alice's own batch 0", got.Batch)
		}
	case <-ctx.Done():
		t.Fatal("alice's early announcement was not delivered once carol's view reached its step")
	}
	if st := c.Stats(); st.Rejected["not_assigned"] != 1 || st.Delivered != 1 {
		t.Fatalf("after the view moved: %d delivered, %d refused as unassigned; want 1 and 1", st.Delivered, st.Rejected["not_assigned"])
	}
	// Only the current step's next is kept: two steps ahead is outside the
	// window, and the current step's unassigned batches are refused at once.
	if _, err := a.Publish(ctx, 11, p2p.BatchRange{Start: 1, End: 2}, []byte("still not alice's batch")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "carol refusing an unassigned batch of her own step", func() bool {
		return c.Stats().Rejected["not_assigned"] == 2
	})
	if st := c.Stats(); st.Early != 2 {
		t.Fatalf("%d early announcements kept, want still 2", st.Early)
	}

	// A view that has the round's step but assigns nothing there yet (a
	// warmup's) keeps a result of that step as it keeps one a step ahead.
	c.SetStep(12)
	c.SetAssignments([]p2p.Assignment{})
	a.SetStep(12)
	a.SetAssignments(assignments(10, 12, alice, carol))
	mine, err = a.Publish(ctx, 12, p2p.BatchRange{Start: 0, End: 1}, []byte("alice's step 12"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "carol keeping the result of a round her view has not assigned", func() bool { return c.Stats().Early == 3 })
	c.SetAssignments(assignments(10, 12, alice, carol))
	select {
	case got := <-c.Announcements():
		if got.Commitment != mine.Commitment {
			t.Fatalf("delivered batch %+v, want alice's step 12 result", got.Batch)
		}
	case <-ctx.Done():
		t.Fatal("alice's result was not delivered once carol's view assigned its batch")
	}
}
