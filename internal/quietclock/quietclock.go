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
// back to back) would never see its clock move, and so never end an epoch:
// SetBusyLimit lets the clock move a step after that much real time without
// an advance even while work is in progress. Timeouts can then race compute
// again, but only in a run that has not waited for the whole limit.
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
	// advanced is the real time of the last advance (or of New); busyLimit
	// is SetBusyLimit's (0: none).
	advanced  time.Time
	busyLimit time.Duration
	tickers   map[*ticker]struct{}
	hooks     []func(time.Time)
	kick      chan struct{} // wakes Run when work ends
}

type ticker struct {
	c      chan time.Time
	period time.Duration
	next   time.Time
}

// New returns a clock that reads start until it is advanced.
func New(start time.Time) *Clock {
	return &Clock{now: start, changed: time.Now(), advanced: time.Now(), tickers: map[*ticker]struct{}{}, kick: make(chan struct{}, 1)}
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

// SetBusyLimit makes Run advance the clock once d of real time has passed
// since the last advance, whether or not work is in progress (0, the
// default: only when quiet).
func (c *Clock) SetBusyLimit(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busyLimit = d
}

// Advance moves the clock forward by d, then runs the hooks and fires the
// tickers that are due.
func (c *Clock) Advance(d time.Duration) {
	done := c.Work()
	defer done()
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.advanced = time.Now()
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
// while some is, and whether the busy limit has passed since the last
// advance.
func (c *Clock) quietFor() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	overdue := c.busyLimit > 0 && time.Since(c.advanced) >= c.busyLimit
	if c.busy > 0 {
		return 0, overdue
	}
	return time.Since(c.changed), overdue
}

// Run advances the clock by step each time no work has been in progress for
// settle (real time), or the busy limit has passed since the last advance,
// until ctx ends. It returns ctx's error.
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
