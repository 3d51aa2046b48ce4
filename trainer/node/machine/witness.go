package machine

import (
	"crypto/sha256"
	"sort"

	"github.com/psyche-go/psyche/coordinator"
)

// maybeWitness sends the witness report for the current round once every
// result is in, or at the latest when the round reaches RoundWitness.
func (m *Machine) maybeWitness(rd *Ready) {
	s := m.snap
	if s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness {
		return
	}
	if _, ok := m.member(); !ok {
		return
	}
	step := s.Progress.Step
	rs := m.round(step)
	if rs.witnessed {
		return
	}
	if s.RunState == coordinator.RoundTrain {
		// A batch whose trainer equivocated or sent a bad result is
		// settled: no result of it will be vouched for. One whose trainer
		// has announced nothing is waited for with patience (patience.go).
		silent := false
		for _, b := range owedBatches(s, s.CurrentRound()) {
			switch {
			case m.results[step][b.start] != nil || m.settledWithout(step, b):
			case m.silent(step, b):
				silent = true
			default:
				return
			}
		}
		if silent && !m.outOfPatience() {
			return
		}
	}
	rs.witnessed = true
	m.witness(rd, false)
}

func (m *Machine) warmupWitness(rd *Ready) {
	if book := m.cur(); !book.warmedUp {
		book.warmedUp = true
		m.witness(rd, true)
	}
}

// witness adds this node's (warmup) witness report if it is an elected
// witness of the current round: the trainers whose results it verified, the
// commitments of those results, and a root over them.
func (m *Machine) witness(rd *Ready, warmup bool) {
	s := m.snap
	i, ok := m.member()
	if !ok {
		return
	}
	r := s.CurrentRound()
	proof := s.Config.WitnessProofFor(r, i)
	if !proof.IsWitness {
		return
	}
	w := coordinator.Witness{Proof: proof, Key: m.newKey()}
	w.Metadata.Step = s.Progress.Step
	w.Metadata.Loss = m.lastBatch.Loss
	w.Metadata.TokensPerSec = m.lastBatch.TokensPerSec
	w.Metadata.BandwidthPerSec = m.lastBatch.BytesPerSec
	h := sha256.New()
	if !warmup {
		// Clients the round gave no data (more trainers than sequences) did
		// all they were asked to.
		for k, d := range s.RoundAssignment(r) {
			if d.Count == 0 && k < int(s.Epoch.ClientsLen) {
				w.Participants.Add(w.Key, coordinator.ParticipantMember(s.Epoch.Clients[k].ID.Signer))
			}
		}
		batches := m.results[s.Progress.Step]
		starts := make([]uint64, 0, len(batches))
		for b := range batches {
			starts = append(starts, b)
		}
		sort.Slice(starts, func(a, b int) bool { return starts[a] < starts[b] })
		for _, b := range starts {
			res := batches[b]
			if res.misreported || m.failing(res.ann.Trainer.Signer) {
				// It, or its trainer's results, failed verification: not
				// vouched for, so not applied (where a quorum of witnesses
				// agree), and the next health check drops its trainer.
				continue
			}
			if m.doomed(res.ann.Trainer.Signer) {
				continue
			}
			w.Participants.Add(w.Key, coordinator.ParticipantMember(res.ann.Trainer.Signer))
			w.Broadcasts.Add(w.Key, res.ann.Commitment)
			h.Write(res.ann.Commitment[:])
		}
	}
	copy(w.Merkle[:], h.Sum(nil))
	if warmup {
		rd.Send = append(rd.Send, &coordinator.WarmupWitness{Report: w})
	} else {
		rd.Send = append(rd.Send, &coordinator.WitnessRound{Report: w})
	}
}

// healthChecks reports, once per round, the clients that a quorum of the
// previous round's witnesses did not see. Only that round's witnesses report,
// and the coordinator checks every claim against the blooms itself. A check
// that lands after its round ended is refused; it is not retried, because the
// next round computes its checks anew: a client that stays dead is missing
// from that round's blooms too, and the next round's witnesses name it.
func (m *Machine) healthChecks(rd *Ready) {
	s := m.snap
	prev := s.PreviousRound()
	if prev == nil {
		return
	}
	rs := m.round(s.Progress.Step)
	if rs.checked {
		return
	}
	rs.checked = true
	me, ok := m.member()
	if !ok {
		return
	}
	wasWitness := false
	for k := 0; k < int(prev.WitnessesLen); k++ {
		wasWitness = wasWitness || prev.Witnesses[k].Proof.Index == me
	}
	if !wasWitness {
		return
	}
	quorum := coordinator.Quorum(s.Config.WitnessCount(prev.ClientsLen))
	cur := s.CurrentRound()
	for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
		c := s.Epoch.Clients[i]
		if c.State != coordinator.Healthy || coordinator.HealthScore(prev, c.ID.Signer) >= quorum {
			continue
		}
		rd.Send = append(rd.Send, &coordinator.HealthCheck{ID: c.ID, Proof: s.Config.HealthCheckProofFor(cur, i)})
	}
}
