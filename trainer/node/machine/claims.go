package machine

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
)

// claim is what a batch's trainer has announced for one step: the first
// commitment and, if it announced a different one too, that one. Two
// commitments signed by one trainer for one batch are proof that it sent
// different results to different peers (equivocation): the node then
// vouches for neither and applies neither, so whichever peer saw which
// version first makes no difference to what it does. One claim per batch
// and step, forgotten with the step's results.
type claim struct {
	trainer     coordinator.Pubkey
	batch       p2p.BatchRange
	first       coordinator.Hash
	second      coordinator.Hash // set once equivocated
	equivocated bool
	// refused: the first result failed its checks (it does not match its
	// commitment, decode, or fit the model). It is the trainer's own fault
	// (the announcement is signed, the blocks verified), so no honest
	// witness will vouch for it and nobody waits for it.
	refused bool
}

// printSeen is who sent a result fingerprint first, and at which step.
type printSeen struct {
	signer coordinator.Pubkey
	step   uint32
}

// printWindow is how many steps of fingerprints a node keeps: a replay of a
// result older than that is not caught (it is as stale as a result can be
// and still in memory anywhere).
const printWindow = 64

// copied records f's fingerprint for a's trainer and step and reports
// whether the same one was seen before from another trainer, or from this
// one at another step. The first sender keeps it: a copier must have
// fetched the original before it could announce the copy, so every witness
// sees the original first unless the two arrive within one fetch of each
// other.
func (m *Machine) copied(a p2p.Announcement, f *distro.Frame) bool {
	if f == nil {
		return false
	}
	fp := f.Fingerprint()
	if seen, ok := m.prints[fp]; ok {
		return seen.signer != a.Trainer.Signer || seen.step != a.Step
	}
	m.prints[fp] = printSeen{signer: a.Trainer.Signer, step: a.Step}
	return false
}

// Announced takes a peer's announcement (gossip or pull).
func (m *Machine) Announced(a p2p.Announcement) Ready {
	var rd Ready
	if m.take(a, &rd) {
		m.progress(&rd)
	}
	return rd
}

// take records an announcement and adds its fetch to rd if the result is
// wanted. It reports whether the announcement proved its trainer
// equivocated (and so changed what this node may witness and apply).
func (m *Machine) take(a p2p.Announcement, rd *Ready) (evidence bool) {
	if a.Trainer == m.id || m.dropped() {
		return false
	}
	if m.snap != nil && a.Step == m.snap.Progress.Step && m.claims[a.Step][a.Batch.Start] == nil {
		m.heard(a.Step) // its batch's first announcement: a pull's repeats are not news
	}
	switch m.claim(a) {
	case claimNew:
		evidence = true
		rd.Report = append(rd.Report, a.Trainer.P2P)
		m.distrust(a.Trainer.Signer, a.Step)
		fallthrough
	case claimEquivocated:
		return evidence
	}
	if m.fetching[a.Commitment] || m.rejected[a.Commitment] || m.results[a.Step][a.Batch.Start] != nil {
		return false
	}
	m.fetching[a.Commitment] = true
	rd.Fetch = append(rd.Fetch, a)
	return false
}

const (
	claimFine        = iota // the first commitment for its batch, or the same again
	claimNew                // a second commitment from the same trainer: new evidence
	claimEquivocated        // the trainer has already been caught
)

// claim records what a's trainer claims for its batch. A second, different
// commitment signed by the same trainer for the same step and batch is
// evidence of equivocation: both versions are discarded (a stored one is
// dropped; a fetch in flight is not stored), so this node leaves the trainer
// out of its witness report, which makes it unhealthy to the next round's
// health checks, and applies no version of the batch. An announcement for
// the batch from another trainer is no evidence against the first (the p2p
// layer admits only the assigned one).
func (m *Machine) claim(a p2p.Announcement) int {
	byBatch := m.claims[a.Step]
	if byBatch == nil {
		byBatch = map[uint64]*claim{}
		m.claims[a.Step] = byBatch
	}
	c := byBatch[a.Batch.Start]
	switch {
	case c == nil:
		byBatch[a.Batch.Start] = &claim{trainer: a.Trainer.Signer, batch: a.Batch, first: a.Commitment}
		return claimFine
	case c.trainer != a.Trainer.Signer || c.batch != a.Batch:
		return claimFine
	case c.equivocated:
		return claimEquivocated
	case c.first == a.Commitment:
		return claimFine
	}
	c.second, c.equivocated = a.Commitment, true
	delete(m.results[a.Step], a.Batch.Start)
	return claimNew
}

// equivocated reports whether the trainer of batch start at step has been
// caught announcing two results for it.
func (m *Machine) equivocated(step uint32, start uint64) bool {
	c := m.claims[step][start]
	return c != nil && c.equivocated
}

// settledWithout reports whether the batch at step will have no result
// this node vouches for: its trainer equivocated or sent a result that
// failed its checks, at this step or within the last distrustSteps, or its
// verified work is failing (verify.go). A witness does not wait for it, and
// nobody pulls for it: a bad trainer must not make every round last its
// training limit. Nor may it when it comes back after a health check
// dropped it: the network then ignores what it sends for a while (gossip
// scoring), and waiting for its result would spend the new epoch's time.
func (m *Machine) settledWithout(step uint32, b owedBatch) bool {
	if c := m.claims[step][b.start]; c != nil && (c.equivocated || c.refused) {
		return true
	}
	if rs := m.rounds[step]; b.trainer == m.id.Signer && rs != nil && rs.satOut {
		return true // this node's own, which it sat out (SatOut)
	}
	if last, ok := m.distrusted[b.trainer]; ok && last <= step && step-last <= distrustSteps {
		return true
	}
	book := m.scores[b.trainer]
	return (book != nil && book.flagged) || m.doomed(b.trainer)
}

// doomed reports whether this round's health check drops trainer, or has:
// a quorum of the previous round's witnesses did not count it (the
// coordinator's own test). Its result of this round is then neither waited
// for nor vouched for, whether the check has landed yet or not, and
// whether the result came before it or after. Before, a witness vouched
// for whatever result of the round it held, so which results a round held
// (and, in a virtual-time localnet, where the run ended: 5% apart in
// held-out loss for one seed) depended on when the trainer's result
// reached each witness against when the check landed.
func (m *Machine) doomed(trainer coordinator.Pubkey) bool {
	s := m.snap
	prev := s.PreviousRound()
	if prev == nil {
		return false
	}
	return coordinator.HealthScore(prev, trainer) < coordinator.Quorum(s.Config.WitnessCount(prev.ClientsLen))
}

// distrustSteps is how long (in steps) a trainer whose result this node
// refused is not waited for.
const distrustSteps = 64

// distrust records that trainer sent a result this node refused at step.
func (m *Machine) distrust(trainer coordinator.Pubkey, step uint32) {
	if m.distrusted == nil {
		m.distrusted = map[coordinator.Pubkey]uint32{}
	}
	if last, ok := m.distrusted[trainer]; !ok || step > last {
		m.distrusted[trainer] = step
	}
}

// Fetched takes a Fetched result: its frame, or why it failed. An invalid
// result is never Fetched again; after any other failure a later
// announcement or pull of it starts a new fetch.
func (m *Machine) Fetched(a p2p.Announcement, f *distro.Frame, err error, invalid bool) Ready {
	delete(m.fetching, a.Commitment)
	var rd Ready
	if err != nil {
		if invalid {
			m.rejected[a.Commitment] = true
			m.distrust(a.Trainer.Signer, a.Step)
			if c := m.claims[a.Step][a.Batch.Start]; c != nil && c.first == a.Commitment && c.trainer == a.Trainer.Signer {
				c.refused = true
			}
			// Its batch is settled now: it may have been the last one this
			// node's witness report waited for. Without this the report
			// waited for the next unrelated event, in the worst case the
			// round's training limit (in a virtual-time localnet, a whole
			// epoch).
			m.progress(&rd)
		}
		return rd
	}
	if m.equivocated(a.Step, a.Batch.Start) {
		return rd // fetched before the conflicting announcement came: discarded
	}
	if m.copied(a, f) {
		// Another trainer's result, or its own from an earlier step: no work
		// of this batch. Treated as a result that failed its checks: left
		// out of this node's witness report (so dropped by the next round's
		// health checks) and of what it applies.
		m.rejected[a.Commitment] = true
		m.distrust(a.Trainer.Signer, a.Step)
		if c := m.claims[a.Step][a.Batch.Start]; c != nil && c.first == a.Commitment && c.trainer == a.Trainer.Signer {
			c.refused = true
		}
		rd.Refused = append(rd.Refused, RefusedResult{Trainer: a.Trainer, Step: a.Step, Why: "a copy or a replay of a result seen before"})
		m.progress(&rd)
		return rd
	}
	m.store(a, f)
	m.verifyWork(a, f, &rd)
	m.progress(&rd)
	return rd
}

// TrainStats is what a node reports about its last trained batch in its
// witness metadata (coordinator.WitnessMetadata): the batch's loss, and the
// tokens and result bytes of the batch over the seconds it took to train
// and publish it. The explorer draws the loss curve and the run's rates
// from them, so they need no service of their own.
type TrainStats struct {
	Loss         float32
	TokensPerSec float32
	BytesPerSec  float32
}

// Trained takes this node's own published result. The round before
// it may now be applied, and then the next round trained ahead.
func (m *Machine) Trained(a p2p.Announcement, f *distro.Frame, st TrainStats) Ready {
	m.copied(a, f) // its fingerprint, so that a copy of it is caught
	m.store(a, f)
	m.lastBatch = st
	m.round(a.Step).done = true
	m.heard(a.Step)
	var rd Ready
	m.progress(&rd)
	return rd
}

// fetchingClaim says whether the batch's announcement is here and its
// result is being fetched: a pull would only bring the announcement again
// (at 256 trainers, ~95 KB from every peer, a pull a second for each
// trainer). A failed fetch ends the claim's fetching, and pulls resume.
func (m *Machine) fetchingClaim(step uint32, b uint64) bool {
	c := m.claims[step][b]
	return c != nil && m.fetching[c.first]
}

// Pulled takes the answer to a pull.
func (m *Machine) Pulled(list []p2p.Announcement) Ready {
	m.pulling = false
	var rd Ready
	evidence := false
	for _, a := range list {
		evidence = m.take(a, &rd) || evidence
	}
	if evidence {
		m.progress(&rd)
	}
	return rd
}

func (m *Machine) store(a p2p.Announcement, f *distro.Frame) {
	r := m.results[a.Step]
	if r == nil {
		r = map[uint64]*result{}
		m.results[a.Step] = r
	}
	if r[a.Batch.Start] == nil {
		r[a.Batch.Start] = &result{ann: a, frame: f}
	}
}
