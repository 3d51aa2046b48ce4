package node

import (
	"context"
	"errors"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/node/drive"
	"github.com/psyche-go/psyche/trainer/node/machine"
)

// loadTry makes one try at loading s's epoch as node n with id does in its
// warmup, at one tick: its machine names a source, and after a failure the
// next source it names at once, until the model is loaded or the machine
// waits for the next tick. It returns every failure of the try (nil: the
// model is loaded). The machine is n's own across tries, so what a try
// learnt (a checkpoint unreadable here, peers given up on) holds for the
// next one of the epoch.
func loadTry(ctx context.Context, n *Node, id coordinator.ClientID, s *coordinator.Coordinator) error {
	if n.cfg.clock == nil {
		n.cfg.clock = wallClock{}
	}
	if n.m == nil {
		n.id, n.m = id, newMachine(id, n.cfg)
	}
	warmup := *s
	warmup.RunState = coordinator.Warmup
	rd := n.m.Snapshot(&warmup, uint64(n.cfg.clock.Now().Unix()))
	if rd.Load == nil {
		return errors.New("the machine asked for no load: is the node a client of the epoch?")
	}
	var errs []error
	for rd.Load != nil {
		err := n.load(ctx, rd.Load)
		var nl *drive.NotLoaded
		if !errors.As(err, &nl) {
			return err // loaded, or a failure no try mends
		}
		errs = append(errs, err)
		rd = n.m.LoadFailed(rd.Load.Epoch, rd.Load.Source, nl.Why, nl.At)
	}
	return errors.Join(errs...)
}

// loadRecorded loads s's recorded checkpoint, the source of a run whose
// checkpoint is not shared over P2P.
func loadRecorded(ctx context.Context, n *Node, s *coordinator.Coordinator) error {
	if n.cfg.clock == nil {
		n.cfg.clock = wallClock{}
	}
	return n.load(ctx, &machine.LoadWork{Epoch: s.Progress.Epoch, Source: machine.LoadRecorded, State: s})
}

// retryable says whether err is a try's failure that a later try may mend.
func retryable(err error) bool {
	var nl *drive.NotLoaded
	return errors.As(err, &nl)
}
