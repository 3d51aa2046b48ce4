package node

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/node/drive"
	"github.com/psyche-go/psyche/trainer/node/machine"
)

// stepClock is a clock the test moves.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time                                  { return c.now }
func (c *stepClock) Ticker(time.Duration) (<-chan time.Time, func()) { return nil, func() {} }
func (c *stepClock) Work() func()                                    { return func() {} }

// A joiner's failed load from peers reaches its machine as the failure the
// full-restart rule reads (machine/load.go): "nobody holds it" when every
// holder said so or this node is the only one, "not yet" when holders did
// not answer.
func TestPeerLoadFailures(t *testing.T) {
	unreachable := fmt.Errorf("%w for epoch 4: dial backoff", p2p.ErrNoCheckpoint)
	nobody := fmt.Errorf("%w for epoch 4 among 3 peers: %w", p2p.ErrNoCheckpoint, p2p.ErrNoHolder)
	for _, tc := range []struct {
		name string
		err  error
		want machine.LoadFailure
	}{
		{"every holder answered it has none", nobody, machine.LoadNoHolder},
		{"this node is the only holder", fmt.Errorf("%w: %w", errLoadLater, errNoOtherHolder), machine.LoadNoHolder},
		{"unreachable holders", fmt.Errorf("%w: %w", errLoadLater, unreachable), machine.LoadNotYet},
	} {
		clock := &stepClock{now: time.Unix(1_700_000_000, 0)}
		n := &Node{cfg: config{clock: clock}}
		var nl *drive.NotLoaded
		if err := n.peersFailed(tc.err); !errors.As(err, &nl) || nl.Why != tc.want || nl.At != 1_700_000_000 || !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want a failure %s at the clock's time", tc.name, err, tc.want)
		}
	}
	n := &Node{cfg: config{clock: &stepClock{}}}
	if err := errors.New("the engine cannot describe the model"); n.peersFailed(err) != err {
		t.Error("an error no try mends was made a failure to retry")
	}
}
