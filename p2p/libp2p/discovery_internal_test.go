package libp2p

import (
	"testing"
	"time"
)

// TestReachBackoff: each dial of a peer, connected or not, doubles the wait
// before the next one up to reachMaxBackoff; only the loss of a connection
// that had stayed up resets it. A peer that completes the handshake and
// hangs up at once (its allowlist does not hold us yet) is not redialled
// every second.
func TestReachBackoff(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	type event struct {
		at      time.Duration // since t0
		dial    bool          // a dial, connected or not (else a drop)
		lived   time.Duration // a drop: how long the connection had stayed up
		next    time.Duration // afterwards: the next dial's time since t0 (-1: at once)
		backoff time.Duration // afterwards
	}
	for _, tc := range []struct {
		name   string
		events []event
	}{
		{"refused at once, again and again", []event{
			{at: 0, dial: true, next: time.Second, backoff: 2 * time.Second},
			{at: 0, lived: 5 * time.Millisecond, next: time.Second, backoff: 2 * time.Second},
			{at: time.Second, dial: true, next: 3 * time.Second, backoff: 4 * time.Second},
			{at: time.Second, lived: time.Millisecond, next: 3 * time.Second, backoff: 4 * time.Second},
			{at: 3 * time.Second, dial: true, next: 7 * time.Second, backoff: 8 * time.Second},
			{at: 7 * time.Second, dial: true, next: 15 * time.Second, backoff: 16 * time.Second},
			{at: 15 * time.Second, dial: true, next: 31 * time.Second, backoff: 30 * time.Second},
			{at: 31 * time.Second, dial: true, next: 61 * time.Second, backoff: 30 * time.Second},
		}},
		{"a connection that stayed up, then dropped", []event{
			{at: 0, dial: true, next: time.Second, backoff: 2 * time.Second},
			{at: 2 * time.Second, dial: true, next: 4 * time.Second, backoff: 4 * time.Second},
			{at: time.Hour, lived: time.Hour - 2*time.Second, next: -1, backoff: time.Second},
			{at: time.Hour, dial: true, next: time.Hour + time.Second, backoff: 2 * time.Second},
		}},
		{"a drop just short of stable keeps the backoff", []event{
			{at: 0, dial: true, next: time.Second, backoff: 2 * time.Second},
			{at: reachStable - time.Millisecond, lived: reachStable - time.Millisecond, next: time.Second, backoff: 2 * time.Second},
			{at: reachStable, lived: reachStable, next: -1, backoff: time.Second},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &reachState{backoff: reachFirstBackoff}
			for i, e := range tc.events {
				if e.dial {
					st.tried(t0.Add(e.at))
				} else {
					st.dropped(e.lived)
				}
				want := time.Time{}
				if e.next >= 0 {
					want = t0.Add(e.next)
				}
				if !st.next.Equal(want) || st.backoff != e.backoff {
					t.Fatalf("event %d: next %v backoff %v, want %v and %v", i, st.next.Sub(t0), st.backoff, e.next, e.backoff)
				}
			}
		})
	}
}
