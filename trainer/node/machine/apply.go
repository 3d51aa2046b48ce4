package machine

import (
	"slices"
	"sort"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/schedule"
)

// OthersResults are the frames of other trainers' results of the latest
// step before step that has any, by batch: what a free-riding adversary
// copies (see adversary.go).
func (m *Machine) OthersResults(step uint32) []*distro.Frame {
	var batches map[uint64]*result
	for back := uint32(1); back <= 4 && back <= step && len(batches) == 0; back++ {
		batches = m.results[step-back]
	}
	starts := make([]uint64, 0, len(batches))
	for b, r := range batches {
		if r.ann.Trainer != m.id && r.frame != nil {
			starts = append(starts, b)
		}
	}
	slices.Sort(starts)
	out := make([]*distro.Frame, len(starts))
	for i, b := range starts {
		out[i] = batches[b].frame
	}
	return out
}

// applyDue applies the consensus results of each round two rounds later
// (train h, witness h during h+1, apply at the start of h+2), in round order,
// once. Every node applies the same results in the same order, so their
// models stay equal. A round is final once the next one starts (its
// witnesses are in), so round h is applied as soon as this node has
// published its result of round h+1 (trained on the model without h): the
// node then trains h+2 ahead on the model round h+2 needs. At the epoch's
// end (Cooldown) every round but the last is applied, by every node alike.
// When a round becomes due, its witness reports are copied (the ring will
// drop them); a result that a quorum of witnesses counted but this node
// does not apply is missing: it is pulled from peers, and the apply waits
// for it (keeping later rounds waiting too) until the epoch ends, when what
// is there is applied. A round applied with anything missing leaves this
// node's model different from the others' (diverged): it is neither served
// nor saved, and the next epoch loads a checkpoint.
func (m *Machine) applyDue(rd *Ready) {
	s := m.snap
	training := s.RunState == coordinator.RoundTrain || s.RunState == coordinator.RoundWitness
	if training || s.RunState == coordinator.Cooldown {
		cur := s.CurrentRound()
		curStep := s.Progress.Step // the step the current round trains
		if !training {
			curStep-- // the epoch's last round, which ended the epoch
		}
		for back := uint32(3); back >= 1; back-- {
			if cur.Height < back {
				continue
			}
			if back == 1 && training && !m.round(curStep).done {
				// The round before the current one is final (its witnesses
				// are in), but this node trains the current round on the
				// model without it first.
				continue
			}
			step := curStep - back
			if rs := m.round(step); !rs.applied && rs.due == nil {
				r := *s.RoundAtHeight(cur.Height - back)
				rs.due = &dueRound{round: r, assignment: s.RoundAssignment(&r), signers: m.signers(&r)}
			}
		}
	}
	// The oldest due round goes first; nothing after it may jump ahead.
	steps := make([]uint32, 0, len(m.rounds))
	for st, rs := range m.rounds {
		if rs.due != nil && !rs.applied {
			steps = append(steps, st)
		}
	}
	if len(steps) == 0 {
		return
	}
	sort.Slice(steps, func(a, b int) bool { return steps[a] < steps[b] })
	step := steps[0]
	rs := m.rounds[step]
	d := rs.due
	work := ApplyWork{Step: step, LR: schedule.LR(s.Model.LR, step)}
	lost := false // a missing result that no pull can bring
	for ti, a := range d.assignment {
		if a.Count == 0 {
			continue
		}
		var signer *coordinator.Pubkey
		if ti < len(d.signers) {
			signer = &d.signers[ti]
		}
		res, c := m.results[step][a.Start], m.claims[step][a.Start]
		switch {
		case res != nil:
			signer = &res.ann.Trainer.Signer
		case c != nil:
			signer = &c.trainer
		}
		// Only a trainer a quorum of witnesses counted can have a winning
		// result: each witness that counts a trainer votes for the one
		// commitment of it it verified. A trainer they did not count
		// produced nothing anyone applies.
		counted := signer != nil && coordinator.HealthScore(&d.round, *signer) >= coordinator.Quorum(s.Config.WitnessCount(d.round.ClientsLen))
		switch {
		case c != nil && c.equivocated:
			// This node applies neither version. When its witnesses caught
			// the trainer too, nobody applies one; when a quorum counted it
			// (they saw one version only, in time), the others may apply a
			// version this node refuses: its model differs, and waiting
			// cannot mend it.
			if _, won := s.Config.ConsensusCommitment(&d.round, []coordinator.Hash{c.first, c.second}); won || counted {
				work.Missing = append(work.Missing, a.Start)
				lost = true
			}
		case res == nil:
			if counted {
				work.Missing = append(work.Missing, a.Start)
			}
		default:
			if _, ok := s.Config.ConsensusCommitment(&d.round, []coordinator.Hash{res.ann.Commitment}); ok && !m.outvoted(&d.round, res, *signer) {
				work.Frames = append(work.Frames, res.frame)
			} else if counted {
				// The witnesses counted the trainer but not (only) this
				// version: they saw another one, which the others may
				// apply. A pull finds it, which proves the equivocation.
				work.Missing = append(work.Missing, a.Start)
			}
		}
	}
	if len(work.Missing) > 0 && !lost && (training || s.RunState == coordinator.Cooldown) {
		if !m.pulling {
			m.pulling = true
			rd.Pull = &step
		}
		return // wait for the missing results while the epoch lasts
	}
	if len(work.Missing) > 0 {
		// The epoch is over without them, or they can never come: this
		// model now differs from the others, so it must not be served or
		// saved, and the next epoch loads the checkpoint instead.
		m.diverged = true
	}
	rs.applied = true
	rs.due = nil
	m.ahead = nil // trained on the model before this apply
	rd.Apply = &work
}

// outvoted reports whether witnesses of round r counted res's trainer
// without voting for res: they verified a different result of it for the
// same batch (a witness puts a trainer in its participant bloom and that
// trainer's one verified commitment in its broadcast bloom together). Its
// version winning a quorum does not then make it the only winner: with two
// versions, each can reach a quorum of a split committee.
func (m *Machine) outvoted(r *coordinator.Round, res *result, signer coordinator.Pubkey) bool {
	member := coordinator.ParticipantMember(signer)
	for i := 0; i < int(r.WitnessesLen); i++ {
		w := &r.Witnesses[i]
		if w.Participants.Has(w.Key, member) && !w.Broadcasts.Has(w.Key, res.ann.Commitment) {
			return true
		}
	}
	return false
}

// hasDue reports whether a round's results are due and not yet applied.
func (m *Machine) hasDue() bool {
	for _, rs := range m.rounds {
		if rs.due != nil && !rs.applied {
			return true
		}
	}
	return false
}

// signers lists the signers of a round's trainers, by index: the epoch's
// list, if no client has left it since the round (else nil, and no trainer is
// judged missing: pulling is only a way to catch up).
func (m *Machine) signers(r *coordinator.Round) []coordinator.Pubkey {
	s := m.snap
	out := make([]coordinator.Pubkey, 0, r.ClientsLen)
	cur := s.Epoch.Clients[:s.Epoch.ClientsLen]
	if int(r.ClientsLen) != len(cur) {
		return nil
	}
	for _, c := range cur {
		out = append(out, c.ID.Signer)
	}
	return out
}
