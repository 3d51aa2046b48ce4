package server

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// Tick advances every run once; each change is persisted before it is
// published.
func (s *Server) Tick() {
	now := s.unixNow()
	for _, id := range s.Runs() {
		r := s.run(id)
		if r == nil {
			continue
		}
		r.mu.Lock()
		// A halted run (paused, finished, not configured) has nothing due:
		// it costs no copy of its state, so idle runs cost little.
		if r.gone || r.state.RunState.Halted() {
			r.mu.Unlock()
			continue
		}
		next := *r.state
		changed, err := next.Tick(now, s.cfg.seed(&next))
		if err == nil && changed {
			// A tick can end an epoch: signers it forgets leave the table.
			replay := r.replay.record(&next, coordinator.Pubkey{}, 0)
			if err := saveRun(s.dir, id, &stored{incarnation: r.incarnation, state: &next, replay: replay}); err != nil {
				s.cfg.log.Error("persisting a tick failed; the tick is dropped", "run", id, "err", err)
			} else {
				from := r.state.RunState
				*r.state, r.replay = next, replay
				r.notify()
				s.setMembers(id, r.state)
				s.cfg.metrics.Transitions.Inc()
				if from != next.RunState {
					// Rounds change state twice a step: DEBUG; the rest
					// (an epoch's start and end, a pause, the finish) INFO.
					level := slog.LevelInfo
					if roundState(from) && roundState(next.RunState) {
						level = slog.LevelDebug
					}
					s.cfg.log.Log(context.Background(), level, "run state", "run", id, "from", from.String(), "to", next.RunState.String(),
						"epoch", next.Progress.Epoch, "step", next.Progress.Step)
				}
			}
		}
		r.mu.Unlock()
	}
}

// roundState says whether a run's steps advance in state st.
func roundState(st coordinator.RunState) bool {
	return st == coordinator.RoundTrain || st == coordinator.RoundWitness
}

// wake tells Serve that a run changed outside a tick.
func (s *Server) wake() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// minTickWait keeps a tick that is due but cannot be persisted from
// spinning.
const minTickWait = 5 * time.Millisecond

// untilDue is how long Serve sleeps before the next tick: until the first
// run's next transition falls due (its state's timeout ends at a whole
// second, coordinator.DueAt), at most the tick interval. Ticking sooner than
// the interval changes no timeout: it only stops a due transition waiting.
func (s *Server) untilDue() time.Duration {
	wait := s.cfg.interval
	if s.cfg.manual {
		return time.Duration(math.MaxInt64)
	}
	now := s.cfg.now()
	s.mu.Lock()
	runs := make([]*run, 0, len(s.runs))
	for _, r := range s.runs {
		runs = append(runs, r)
	}
	s.mu.Unlock()
	for _, r := range runs {
		r.mu.Lock()
		at, ok := r.state.DueAt(uint64(now.Unix()))
		r.mu.Unlock()
		if ok {
			wait = min(wait, time.Unix(int64(at), 0).Sub(now))
		}
	}
	return max(wait, minTickWait)
}
