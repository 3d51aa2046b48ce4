package quietclock

import (
	"context"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1_800_000_000, 0)

func TestAdvanceRunsHooksThenTickers(t *testing.T) {
	c := New(t0)
	var order []string
	c.OnAdvance(func(now time.Time) { order = append(order, "hook1 "+now.Sub(t0).String()) })
	c.OnAdvance(func(now time.Time) { order = append(order, "hook2 "+now.Sub(t0).String()) })
	every2, stop := c.Ticker(2 * time.Second)
	defer stop()

	tests := []struct {
		advance  time.Duration
		wantTick bool
	}{
		{time.Second, false},
		{time.Second, true},      // 2s: due
		{time.Second, false},     // 3s: next at 4s
		{5 * time.Second, true},  // 8s: due, next at 10s (missed ticks are not queued)
		{time.Second, false},     // 9s
		{time.Second, true},      // 10s
		{30 * time.Second, true}, // 40s
	}
	for i, tt := range tests {
		c.Advance(tt.advance)
		select {
		case got := <-every2:
			if !tt.wantTick {
				t.Fatalf("advance %d: unexpected tick at %v", i, got.Sub(t0))
			}
			if !got.Equal(c.Now()) {
				t.Fatalf("advance %d: tick carries %v, clock reads %v", i, got.Sub(t0), c.Now().Sub(t0))
			}
		default:
			if tt.wantTick {
				t.Fatalf("advance %d (clock at %v): no tick", i, c.Now().Sub(t0))
			}
		}
	}
	if got := c.Now().Sub(t0); got != 40*time.Second {
		t.Fatalf("clock at %v, want 40s", got)
	}
	if len(order) != 14 || order[0] != "hook1 1s" || order[1] != "hook2 1s" || order[13] != "hook2 40s" {
		t.Fatalf("hooks ran as %v", order)
	}
}

func TestStoppedTickerGetsNothing(t *testing.T) {
	c := New(t0)
	ch, stop := c.Ticker(time.Second)
	stop()
	c.Advance(5 * time.Second)
	select {
	case <-ch:
		t.Fatal("a stopped ticker fired")
	default:
	}
}

// TestRunWaitsForWork: while work is in progress the clock stands still;
// once all of it has ended, Run advances it. The test waits for events
// (hook calls), never for a length of time.
func TestRunWaitsForWork(t *testing.T) {
	c := New(t0)
	advanced := make(chan time.Time, 100)
	c.OnAdvance(func(now time.Time) { advanced <- now })
	first, second := c.Work(), c.Work()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx, time.Second, time.Millisecond) })

	// With work in progress, Run looks at the clock many times (every settle
	// period) and never advances it: give it a thousand chances.
	time.Sleep(time.Second)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("the clock moved to %v while work was in progress", got.Sub(t0))
	}
	first()
	first() // a second call does nothing: the other work still holds the clock
	time.Sleep(100 * time.Millisecond)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("the clock moved to %v while work was in progress", got.Sub(t0))
	}
	second()
	if got := <-advanced; !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("first advance to %v, want 1s", got.Sub(t0))
	}
	if got := <-advanced; !got.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("second advance to %v, want 2s", got.Sub(t0))
	}
	cancel()
	wg.Wait()
}

// TestProgressMovesABusyClock: work that never ends does not stop the clock
// for good: each round that passed without an advance is charged one when
// the next begins, and only then. The test waits for the advances (events),
// however long the machine takes to get there.
func TestProgressMovesABusyClock(t *testing.T) {
	c := New(t0)
	advanced := make(chan time.Time, 100)
	c.OnAdvance(func(now time.Time) { advanced <- now })
	done := c.Work() // never quiet until the end
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx, time.Second, time.Millisecond) })
	for i := 1; i <= 3; i++ {
		c.Progressed() // round i begins; round i-1 (or the start) saw no advance
		if got := <-advanced; !got.Equal(t0.Add(time.Duration(i) * time.Second)) {
			t.Fatalf("advance %d to %v, want %ds", i, got.Sub(t0), i)
		}
	}
	cancel()
	wg.Wait()
}

// TestProgressOwesNothingAfterAnAdvance: a round during which the clock
// moved (here by hand) is charged nothing when the next begins.
func TestProgressOwesNothingAfterAnAdvance(t *testing.T) {
	for _, tc := range []struct {
		name     string
		advances int // during the round, before the next one begins
		owed     bool
	}{
		{"no advance", 0, true},
		{"one advance", 1, false},
		{"two advances", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(t0)
			c.Progressed() // the first round begins; the start owes one
			c.Advance(time.Second)
			for range tc.advances {
				c.Advance(time.Second)
			}
			c.Progressed()
			if _, owed := c.quietFor(); owed != tc.owed {
				t.Fatalf("owed %v, want %v", owed, tc.owed)
			}
		})
	}
}

// TestHookWorkDelaysTheNextAdvance: work a hook starts (a server tick that
// publishes a state) holds the clock until it ends.
func TestHookWorkDelaysTheNextAdvance(t *testing.T) {
	c := New(t0)
	pending := make(chan func(), 1)
	advanced := make(chan time.Time, 10)
	c.OnAdvance(func(now time.Time) {
		advanced <- now
		if now.Equal(t0.Add(time.Second)) {
			pending <- c.Work()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx, time.Second, time.Millisecond) })
	<-advanced
	done := <-pending
	time.Sleep(200 * time.Millisecond)
	if got := c.Now(); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("the clock moved to %v while the hook's work was in progress", got.Sub(t0))
	}
	done()
	if got := <-advanced; !got.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("advance to %v, want 2s", got.Sub(t0))
	}
	cancel()
	wg.Wait()
}
