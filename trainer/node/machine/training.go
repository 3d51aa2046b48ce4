package machine

import (
	"slices"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/schedule"
)

// owedBatch is a batch a witness waits for, and the trainer it is
// assigned to (zero where the round has more batches than the epoch has
// clients).
type owedBatch struct {
	start   uint64
	trainer coordinator.Pubkey
}

// owedBatches are the batches of r whose trainers are still healthy: the
// results a witness waits for and pulls. A trainer dropped by a health check
// stops training, so waiting for its batch would hold every witness until
// the round's training limit.
func owedBatches(s *coordinator.Coordinator, r *coordinator.Round) []owedBatch {
	var out []owedBatch
	for i, d := range s.RoundAssignment(r) {
		if d.Count == 0 {
			continue
		}
		if i >= int(s.Epoch.ClientsLen) {
			out = append(out, owedBatch{start: d.Start})
		} else if c := s.Epoch.Clients[i]; c.State == coordinator.Healthy {
			out = append(out, owedBatch{start: d.Start, trainer: c.ID.Signer})
		}
	}
	return out
}

// train asks for this node's batch of the current round, once.
func (m *Machine) train(rd *Ready) {
	s := m.snap
	step := s.Progress.Step
	rs := m.round(step)
	if rs.trained {
		return
	}
	rs.trained = true
	ahead := m.ahead
	m.ahead = nil
	i, _ := m.member()
	assignment := s.RoundAssignment(s.CurrentRound())
	if int(i) >= len(assignment) || assignment[i].Count == 0 {
		rs.done = true
		return // more trainers than sequences this round
	}
	d := assignment[i]
	w := &TrainWork{Step: step, Batch: p2p.BatchRange{Start: d.Start, End: d.Start + d.Count}, LR: schedule.LR(s.Model.LR, step),
		Deadline: s.RunStateStart + s.Config.MaxRoundTrainTime}
	// The guess was right (the same clients started the round): the
	// gradient trained ahead is this batch's, on this model.
	w.Reuse = ahead != nil && ahead.Step == w.Step && ahead.Batch == w.Batch
	w.Reference = m.referenceSequences()
	rd.Train = w
}

// SatOut says this node did not train its batch of step: its data did not
// come by the round's deadline (TrainWork.Deadline), or cannot be read.
// Nothing is published, and the witnesses leave this node out of the round
// as they leave out any trainer whose result does not come; its training
// of the round counts as done, so the rounds before are applied as they
// would have been (applyDue) and its model stays the others'.
func (m *Machine) SatOut(step uint32) Ready {
	rs := m.round(step)
	rs.done, rs.satOut = true, true
	var rd Ready
	m.progress(&rd)
	return rd
}

// trainAhead trains the next round's batch while this one is witnessed: its
// data assignment is known a round early (the coordinator's NextRound), and
// the model it must be trained on is the one this node holds once it has
// published this round's result and applied the round before (each round is
// applied two rounds after it is trained, so this is the order every
// trainer follows, ahead or not). If a client is dropped before the round
// starts, or the epoch ends instead, the assignment differs and train asks
// for the batch again; nothing trained ahead is published. Once a round.
func (m *Machine) trainAhead(rd *Ready) {
	s := m.snap
	if rd.Train != nil || (s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness) || !m.cur().ready {
		return
	}
	if _, ok := m.member(); !ok {
		return
	}
	step, e := s.Progress.Step, &s.Epoch
	if rs := m.rounds[step]; rs == nil || !rs.done || (m.ahead != nil && m.ahead.Step == step+1) {
		return
	}
	if next := m.rounds[step+1]; next != nil && next.trained {
		return
	}
	if s.CurrentRound().Height >= 1 {
		if prev := m.rounds[step-1]; prev == nil || !prev.applied {
			return // the next round trains on the model with the round before this one applied
		}
	}
	if (e.LastStep != 0 && step+1 >= e.LastStep) || step+1 >= s.Config.TotalSteps || s.PendingPause {
		return // the epoch ends after this round
	}
	r, trainers, ok := s.NextRound()
	if !ok {
		return
	}
	i := slices.Index(trainers, m.id.Signer)
	assignment := s.RoundAssignment(&r)
	if i < 0 || i >= len(assignment) || assignment[i].Count == 0 {
		return
	}
	d := assignment[i]
	m.ahead = &TrainWork{Step: step + 1, Batch: p2p.BatchRange{Start: d.Start, End: d.Start + d.Count}, LR: schedule.LR(s.Model.LR, step+1), Ahead: true}
	w := *m.ahead
	rd.Train = &w
}
