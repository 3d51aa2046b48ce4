package node

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// sendTick sends a tick instruction in the background and tells the loop
// when it has landed or failed.
func (n *Node) sendTick(ctx context.Context, ev events) {
	working := n.cfg.clock.Work() // until Run has taken the answer
	go func() {
		if _, err := n.backend.Send(ctx, n.runID, n.signer, nil, &coordinator.Tick{}); err != nil {
			if ctx.Err() == nil {
				n.cfg.log.Debug("tick refused", "err", err)
			}
		} else {
			n.cfg.metrics.Ticks.Inc()
		}
		select {
		case ev.ticked <- working:
		case <-ctx.Done():
			working()
		}
	}()
}

// outgoing is an instruction on its way to the sender; done ends the work
// it counts as.
type outgoing struct {
	ix   coordinator.Instruction
	done func()
}

func (n *Node) send(ctx context.Context, ix coordinator.Instruction) {
	start := time.Now() // a send's latency is part of the round's
	if _, err := n.backend.Send(ctx, n.runID, n.signer, nil, ix); err != nil {
		if ctx.Err() != nil {
			return
		}
		// A refusal is the coordinator's answer; anything else (a server
		// that is down, a lost connection) never reached it.
		var refusal *coordinator.Error
		if errors.As(err, &refusal) {
			n.cfg.log.Warn("instruction refused", "ix", ix.Name(), "err", err)
		} else {
			n.cfg.log.Warn("instruction not delivered", "ix", ix.Name(), "err", err)
		}
		return
	}
	switch ix.(type) {
	case *coordinator.WitnessRound, *coordinator.WarmupWitness:
		n.cfg.metrics.WitnessReports.Inc()
	}
	level := slog.LevelInfo
	if _, ok := ix.(*coordinator.WitnessRound); ok {
		level = slog.LevelDebug // one a round: the epoch's line counts them
	}
	n.cfg.log.Log(ctx, level, "sent", "ix", ix.Name(), "took", time.Since(start).Round(time.Millisecond))
}
