package machine

import (
	"github.com/psyche-go/psyche/coordinator"
)

// Tick runs once a second with the time (unix seconds, the coordinator's
// unit): it asks peers directly for results gossip has not delivered,
// retries a model load that failed (peers that were not reachable yet) and,
// WithTicking, sends a Tick when its turn comes (see turnToTick).
func (m *Machine) Tick(now uint64) Ready {
	var rd Ready
	m.watch(now)
	m.now = max(m.now, now)
	s := m.snap
	if s == nil {
		return rd
	}
	m.began()
	rd.Tick = m.TurnToTick(now)
	if !m.cur().ready {
		if _, ok := m.member(); ok && s.RunState == coordinator.Warmup {
			rd.Load = m.loadWork()
		}
		return rd
	}
	if s.RunState == coordinator.Cooldown {
		m.cooldown(&rd)
		return rd
	}
	if !m.pulling && (s.RunState == coordinator.RoundTrain || s.RunState == coordinator.RoundWitness) {
		step := s.Progress.Step
		for _, b := range owedBatches(s, s.CurrentRound()) {
			if m.results[step][b.start] == nil && !m.fetchingClaim(step, b.start) && !m.settledWithout(step, b) {
				m.pulling = true
				rd.Pull = &step
				break
			}
		}
	}
	if rd.Pull == nil {
		m.applyDue(&rd)
		m.trainAhead(&rd)
	}
	// A silent trainer's batch may have been waited for long enough.
	m.maybeWitness(&rd)
	return rd
}

// TickDue runs between the one-second ticks of a node that ticks the run
// (WithTicking), with the time: it sends a tick as soon as the node's turn
// comes (turnToTick), so a transition that falls due at a whole second does
// not wait for the next one-second tick, nor a second more when the chain's
// clock was a slot behind and the first tick changed nothing. It does
// nothing else (pulls and load retries stay once a second).
func (m *Machine) TickDue(now uint64) Ready {
	m.now = max(m.now, now)
	if m.snap == nil {
		return Ready{}
	}
	return Ready{Tick: m.TurnToTick(now)}
}

// TurnToTick reports whether to send a tick now: ticking the last snapshot
// at now would change it (the coordinator is pure, so a copy shows the
// outcome), and it is this node's turn. Every trainer would pay for a tick
// that only the first can use, so they take turns: the epoch's client at
// index i waits until the transition has been due for i seconds (others for
// one more than the clients), which costs a second per trainer that is
// gone. At most one tick is in flight.
func (m *Machine) TurnToTick(now uint64) bool {
	s := m.snap
	if !m.ticking || m.tickInFlight {
		return false
	}
	probe := *s
	if changed, err := probe.Tick(now, 0); err != nil || !changed {
		m.dueSince = 0
		return false
	}
	if m.dueSince == 0 {
		m.dueSince = now
	}
	turn := uint64(s.Epoch.ClientsLen) + 1
	if i, ok := s.ClientIndex(m.id.Signer); ok {
		turn = uint64(i)
	}
	if now-m.dueSince < turn {
		return false
	}
	m.tickInFlight = true
	return true
}

// TickSent says the tick asked for has landed or failed.
func (m *Machine) TickSent() { m.tickInFlight = false }
