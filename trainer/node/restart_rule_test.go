package node

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// stepClock is a clock the test moves.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time                                  { return c.now }
func (c *stepClock) Ticker(time.Duration) (<-chan time.Time, func()) { return nil, func() {} }
func (c *stepClock) Work() func()                                    { return func() {} }

// The full-restart rule: a joiner gives up on its peers for the run's URL
// at once when nobody holds the model, and otherwise after its checkpoint
// wait, counted from its first failure in the epoch.
func TestPeersGaveUp(t *testing.T) {
	unreachable := fmt.Errorf("%w for epoch 4: dial backoff", p2p.ErrNoCheckpoint)
	nobody := fmt.Errorf("%w for epoch 4 among 3 peers: %w", p2p.ErrNoCheckpoint, p2p.ErrNoHolder)
	for _, tc := range []struct {
		name   string
		warmup uint64        // the run's warmup time, seconds
		wait   time.Duration // WithCheckpointWait
		tries  []time.Duration
		err    error
		want   []bool
	}{
		{"every holder answered it has none", 60, 0, []time.Duration{0}, nobody, []bool{true}},
		{"this node is the only holder", 60, 0, []time.Duration{0}, fmt.Errorf("%w: %w", errLoadLater, errNoOtherHolder), []bool{true}},
		{"unreachable holders: half the warmup", 60, 0, []time.Duration{0, 29 * time.Second, 30 * time.Second}, unreachable, []bool{false, false, true}},
		{"a short warmup waits 5 s", 4, 0, []time.Duration{0, 4 * time.Second, 5 * time.Second}, unreachable, []bool{false, false, true}},
		{"WithCheckpointWait", 60, 2 * time.Second, []time.Duration{0, time.Second, 2 * time.Second}, unreachable, []bool{false, false, true}},
	} {
		clock := &stepClock{now: time.Unix(1_700_000_000, 0)}
		n := &Node{cfg: config{clock: clock, checkpointWait: tc.wait}}
		s := &coordinator.Coordinator{}
		s.Config.WarmupTime = tc.warmup
		s.Progress.Epoch = 4
		start := clock.now
		for i, at := range tc.tries {
			clock.now = start.Add(at)
			if got := n.peersGaveUp(s, tc.err); got != tc.want[i] {
				t.Errorf("%s: try at %v: gave up = %v, want %v", tc.name, at, got, tc.want[i])
			}
		}
	}
	// A new epoch starts the wait again.
	clock := &stepClock{now: time.Unix(1_700_000_000, 0)}
	n := &Node{cfg: config{clock: clock}}
	s := &coordinator.Coordinator{}
	s.Config.WarmupTime = 20
	s.Progress.Epoch = 1
	n.peersGaveUp(s, errors.New("unreachable"))
	clock.now = clock.now.Add(time.Minute)
	s.Progress.Epoch = 2
	if n.peersGaveUp(s, errors.New("unreachable")) {
		t.Error("the wait carried over into the next epoch")
	}
}
