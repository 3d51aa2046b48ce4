// Package quietclock owns the virtual time of a run that is played out on
// one machine for a test or a demo: a clock that moves forward only while
// the system it watches is quiet. The parts of the run (the server's ticks,
// the trainers' event loops, their fetches and sends) mark the work they do
// with Work; once no work has been in progress for a settle period of real
// time, Run advances the clock by one step and calls the advance hooks (a
// server tick, a validator's clock). Every timeout of the run then measures
// waiting, never computing: a round that takes a minute of compute on a
// loaded machine still ends by its witnesses, and an epoch of N seconds
// holds the same number of steps on a fast machine and a slow one.
//
// A run that never waits (its rounds end as soon as their results are in,
// back to back) would never see its clock move, and so never end an epoch.
// The driver reports each new round with Progressed: a round during which
// the clock did not move costs one step when the next one starts. So an
// epoch of N seconds holds at most about N back-to-back rounds however long
// their compute takes, and no timeout races compute.
//
// The settle period covers what no Work marks: a message in flight between
// two parts (a gossip announcement, a snapshot on its way to a subscriber).
// Missing one costs one extra step of virtual time, which a run's timeouts
// should be large enough to absorb; it never loses an event.
package quietclock

import (
	"context"
	"sync"
	"time"
)

// Clock is a virtual clock. The zero value is not usable; call New.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	busy    int
	changed time.Time // real time of the last change in busy, or of the last advance
	// advances counts them; sinceRound is its value when the current round
	// began (Progressed), and owed says that the round before it ended
	// without one, so Run advances as soon as it looks.
	advances   uint64
	sinceRound uint64
	owed       bool
	tickers    map[*ticker]struct{}
	hooks      []func(time.Time)
	kick       chan struct{} // wakes Run when work ends
}

type ticker struct {
	c      chan time.Time
	period time.Duration
	next   time.Time
}

// New returns a clock that reads start until it is advanced.
func New(start time.Time) *Clock {
	return &Clock{now: start, changed: time.Now(), tickers: map[*ticker]struct{}{}, kick: make(chan struct{}, 1)}
}

// Now is the virtual time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Work marks work in progress until the returned function is called (once;
// later calls do nothing). The clock does not advance while any work is in
// progress, nor for the settle period after the last ended.
func (c *Clock) Work() (done func()) {
	c.mu.Lock()
	c.busy++
	c.changed = time.Now()
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			c.busy--
			c.changed = time.Now()
			c.mu.Unlock()
			select {
			case c.kick <- struct{}{}:
			default:
			}
		})
	}
}

// Ticker returns a channel that receives the virtual time whenever the clock
// has advanced by at least period since the last delivery (a slow reader
// misses ticks, as with time.Ticker), and a function that stops it.
func (c *Clock) Ticker(period time.Duration) (<-chan time.Time, func()) {
	t := &ticker{c: make(chan time.Time, 1), period: period}
	c.mu.Lock()
	t.next = c.now.Add(period)
	c.tickers[t] = struct{}{}
	c.mu.Unlock()
	return t.c, func() {
		c.mu.Lock()
		delete(c.tickers, t)
		c.mu.Unlock()
	}
}

// OnAdvance registers f to be called with the new time after every advance,
// before the clock may advance again (hooks run one at a time, in the order
// they were registered, and count as work).
func (c *Clock) OnAdvance(f func(now time.Time)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hooks = append(c.hooks, f)
}

// Progressed reports that the watched run began a new round. If the clock
// has not moved since the previous round began, that round is charged one
// step now (Run advances at once, work in progress or not); the new round
// starts with no advance to its name either way.
func (c *Clock) Progressed() {
	c.mu.Lock()
	if c.advances == c.sinceRound && !c.owed {
		c.owed = true
		c.sinceRound = c.advances + 1 // the owed advance is the old round's
	} else {
		c.sinceRound = c.advances
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Advance moves the clock forward by d, then runs the hooks and fires the
// tickers that are due.
func (c *Clock) Advance(d time.Duration) {
	done := c.Work()
	defer done()
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.advances++
	c.owed = false
	now := c.now
	hooks := append([]func(time.Time){}, c.hooks...)
	c.mu.Unlock()
	for _, f := range hooks {
		f(now)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.tickers {
		if now.Before(t.next) {
			continue
		}
		t.next = now.Add(t.period)
		select {
		case t.c <- now:
		default:
		}
	}
}

// quietFor reports how long (real time) no work has been in progress, or 0
// while some is, and whether a round is owed an advance (Progressed).
func (c *Clock) quietFor() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy > 0 {
		return 0, c.owed
	}
	return time.Since(c.changed), c.owed
}

// Run advances the clock by step each time no work has been in progress for
// settle (real time), and at once for a round that is owed one
// (Progressed), until ctx ends. It returns ctx's error.
func (c *Clock) Run(ctx context.Context, step, settle time.Duration) error {
	timer := time.NewTimer(settle)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.kick:
		case <-timer.C:
		}
		quiet, overdue := c.quietFor()
		if quiet >= settle || overdue {
			c.Advance(step)
			quiet = 0
		}
		wait := settle - quiet
		if quiet == 0 {
			wait = settle // busy: look again after a settle period (or when work ends)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}
