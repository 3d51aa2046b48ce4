package simscale

import (
	"container/heap"
	"time"
)

// sched is the discrete-event queue: events run in order of virtual time,
// and events at the same time in the order they were scheduled, so a run
// is a function of its seed.
type sched struct {
	now    time.Duration // virtual time since the simulation began
	seq    uint64
	events eventHeap
	ran    uint64 // events run, for the report
}

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*h = old[:len(old)-1]
	return e
}

// at schedules fn at virtual time t (now, if t is in the past).
func (s *sched) at(t time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.events, event{at: max(t, s.now), seq: s.seq, fn: fn})
}

// after schedules fn d from now.
func (s *sched) after(d time.Duration, fn func()) { s.at(s.now+d, fn) }

// run runs events until stop reports true, the queue is empty or the
// virtual time passes limit; it reports whether stop ended it.
func (s *sched) run(stop func() bool, limit time.Duration) bool {
	for len(s.events) > 0 {
		if stop() {
			return true
		}
		e := heap.Pop(&s.events).(event)
		if e.at > limit {
			return false
		}
		s.now = e.at
		s.ran++
		e.fn()
	}
	return stop()
}
