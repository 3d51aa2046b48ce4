package node

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"sort"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/schedule"
)

// machine holds the trainer's decisions and none of its I/O, in the manner
// of raft's RawNode: each event (a coordinator snapshot, an announcement, a
// fetched or trained result, the model being ready, a timer tick, a pull
// answer) returns a Ready that says what to do; the driver (Node.Run) does it
// and reports back with more events. It is single-threaded and deterministic
// given its inputs (witness bloom keys come from newKey).
type machine struct {
	id      coordinator.ClientID
	epochs  int  // leave after this many epochs (0: never)
	ticking bool // send ticks when a transition is due (WithTicking)
	newKey  func() uint64
	// joinAfter are the trainers that join each epoch before this one
	// (WithJoinOrder).
	joinAfter []coordinator.Pubkey

	snap     *coordinator.Coordinator
	results  map[uint32]map[uint64]*result // step → batch start → first verified result
	claims   map[uint32]map[uint64]*claim  // step → batch start → what its trainer announced
	fetching map[coordinator.Hash]bool
	rejected map[coordinator.Hash]bool // results that failed their checks: never fetched again
	// prints are the fingerprints (distro.Frame.Fingerprint) of the results
	// of the last printWindow steps, with who sent each first and when: a
	// result that says what another trainer's said (a copy, even rescaled)
	// or what its own trainer's said at an earlier step (a replay) did no
	// work of its own and is refused.
	prints    map[[32]byte]printSeen
	rounds    map[uint32]*roundState // by step
	book      epochBook              // what this node has done in the current epoch
	prev      epochBook              // and in the one before
	trained   int                    // epochs this node has ended as a client
	lastBatch trainStats             // the last trained batch: loss and rates, reported in witness metadata
	pulling   bool                   // a pull is in flight
	diverged  bool                   // a round was applied without every consensus result
	// ahead is the gradient trained ahead for the next round (TrainWork.Ahead),
	// valid until the model changes (an apply or a load clears it).
	ahead *TrainWork

	// scores are the verification scores of trainers this node witnessed
	// (verify.go), by signer.
	scores map[coordinator.Pubkey]*scoreBook
	// distrusted are the trainers whose results this node refused (bad,
	// copied, equivocated), with the last step it did.
	distrusted map[coordinator.Pubkey]uint32

	dueSince     uint64 // when a tick became due (unix seconds; 0: none is due)
	tickInFlight bool   // a tick instruction is on its way

	// now is the time of the latest tick (unix seconds; 0 before the
	// first): when results arrive, for a witness's patience with silent
	// trainers (patience.go).
	now uint64
	// paces are the paces of the last complete rounds (patience.go), a
	// ring written at paceNext.
	paces    [paceRounds]uint64
	paceNext int
}

// epochBook records what the node has done once in one epoch. The node keeps
// the current epoch's and the previous one's (a joiner's load asks whether
// this node ended the previous epoch holding its final model).
type epochBook struct {
	epoch    uint32
	joined   bool // join_run sent for it
	ready    bool // the model is loaded for it
	warmedUp bool // the warmup witness was sent
	held     bool // it ended as a client with every result applied: it holds the final model
	saved    bool // the checkpoint was asked for
	counted  bool // counted in trained
}

// epochBook returns the book of epoch e, turning the page when e is new.
func (m *machine) bookFor(e uint32) *epochBook {
	if m.book.epoch != e {
		m.prev, m.book = m.book, epochBook{epoch: e}
	}
	return &m.book
}

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

// result is a verified peer (or own) result for one batch.
type result struct {
	ann   p2p.Announcement
	frame *distro.Frame
	// misreported: the losses it reports are not what the round's model
	// gives on its batch (verify.go): this node does not vouch for it.
	misreported bool
}

// othersResults are the frames of other trainers' results of the latest
// step before step that has any, by batch: what a free-riding adversary
// copies (see adversary.go).
func (m *machine) othersResults(step uint32) []*distro.Frame {
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
func (m *machine) copied(a p2p.Announcement, f *distro.Frame) bool {
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

type roundState struct {
	trained, witnessed, applied, checked bool
	// done: this node's training of the round is published (or it had no
	// batch): the round before may now be applied (see applyDue).
	done bool
	due  *dueRound // set when the round's results are due and not yet applied
	// began and heard are when this node first saw the round train and
	// when the latest of its announcements (or this node's result) came;
	// paced: its pace is recorded (patience.go).
	began, heard uint64
	paced        bool
	// reference are this node's losses of the round's sampled sequences on
	// the model the round trained on (by data index); pending are sampled
	// results that came before them, to check once they are in.
	reference map[uint64]float32
	pending   []lossReport
}

// dueRound keeps what deciding a round's consensus needs after the
// coordinator's ring has moved on.
type dueRound struct {
	round      coordinator.Round
	assignment []coordinator.DataRange
	signers    []coordinator.Pubkey
}

// Ready is what the driver does next, in field order. Work that answers
// with an event (a load, a training) is followed, after the rest of this
// Ready, by the Ready that event returns; Fetch, Pull and Tick answer later,
// as events of their own.
type Ready struct {
	// Apply asks to apply a round's consensus results, in this order.
	Apply *ApplyWork
	// Load asks for the model, optimizer and data of an epoch; Keep says the
	// model in memory may stay (it is the previous epoch's end, which P2P
	// checkpoints serve). Answer with loaded.
	Load *LoadWork
	// Train asks to train this node's batch and publish it. Answer with
	// trainedResult.
	Train *TrainWork
	// Send lists instructions for the coordinator.
	Send []coordinator.Instruction
	// Fetch lists announced results to fetch and check. Answer each with
	// fetched.
	Fetch []p2p.Announcement
	// Pull asks peers directly for a step's announcements. Answer with pulled.
	Pull *uint32
	// Share asks to serve the model to the joiners of epoch Share (a P2P
	// checkpoint): this node ended the epoch before with every result
	// applied.
	Share *uint32
	// Save asks to save the model and record it as the epoch's checkpoint.
	Save *SaveWork
	// Tick asks to send a tick instruction (WithTicking). Answer with
	// tickSent once it has landed or failed.
	Tick bool
	// Done says the node should stop, and why: the run is finished, or the
	// node has trained the epochs it was asked to.
	Done string
	// Report lists peers (p2p keys) caught equivocating: the driver tells
	// the network, which then trusts them less (gossip scoring).
	Report []coordinator.Pubkey
	// Refused lists results refused for what they say rather than for how
	// they were sent (a copy of another trainer's, a replay): the driver
	// logs and counts them.
	Refused []RefusedResult
	// Verify lists sampled results to score (verified work, verify.go).
	// Answer each with verified.
	Verify []VerifyWork
	// Reports lists the loss reports checked (verify.go): the driver logs
	// them, so that a refusal can be traced to the reports behind it.
	Reports []ReportChecked
	// DropFetches says the fetches in flight and waiting serve nothing
	// now: this node is no longer a client of the epoch (a health check
	// dropped it). Its peers may never answer it (they ignore a peer whose
	// result they refused), and a fetch left to its timeouts would hold
	// the driver's work for minutes.
	DropFetches bool
}

// ReportChecked is the verdict on one sampled result's loss report: Why
// is empty when its losses are this node's.
type ReportChecked struct {
	Trainer coordinator.ClientID
	Step    uint32
	Why     string
}

// RefusedResult is one result refused by the witness rules.
type RefusedResult struct {
	Trainer coordinator.ClientID
	Step    uint32
	Why     string
}

// SaveWork names the checkpoint to save.
type SaveWork struct {
	Epoch, Step uint32
	// Store is the run's checkpoint store (zero: the file stays here).
	Store coordinator.CheckpointStore
}

// LoadWork describes a model load: the coordinator state of the epoch to
// load for (its model, checkpoint source and holders).
type LoadWork struct {
	Epoch uint32
	Keep  bool
	State *coordinator.Coordinator
}

// TrainWork describes this node's batch of a round.
//
// Ahead: the round has not started; its assignment is the coordinator's
// NextRound. Compute the batch's gradient on the model as it is now, in the
// background, and keep it; nothing is published and nothing answers. The
// driver must finish it before it changes the model (an apply, a load) or
// trains again.
//
// Reuse: the gradient trained ahead for this step and batch is still valid
// (the model has not changed since): step the optimizer with it and publish
// instead of computing it again. A driver that holds no such gradient
// computes it.
type TrainWork struct {
	Step  uint32
	Batch p2p.BatchRange
	LR    float32
	Ahead bool
	Reuse bool
	// Reference lists sequences whose losses this node measures once the
	// result is published, on the model it was trained on (the round's
	// sampled batches' scored sequences, verification_percent): what the
	// sampled trainers' reported losses must match. Answer with
	// referenceLosses, before anything changes the model.
	Reference []p2p.BatchRange
}

// ApplyWork is a round's consensus results. Missing lists batches that a
// quorum of the round's witnesses counted but whose result this node does
// not apply: it never arrived, or this node holds another version than the
// others may apply (its trainer equivocated). The model then differs from
// the others'.
type ApplyWork struct {
	Step    uint32
	Frames  []*distro.Frame
	LR      float32
	Missing []uint64
}

func newMachine(id coordinator.ClientID, epochs int, ticking bool, newKey func() uint64) *machine {
	return &machine{id: id, epochs: epochs, ticking: ticking, newKey: newKey,
		results: map[uint32]map[uint64]*result{}, claims: map[uint32]map[uint64]*claim{}, fetching: map[coordinator.Hash]bool{},
		rejected: map[coordinator.Hash]bool{}, rounds: map[uint32]*roundState{}, prints: map[[32]byte]printSeen{}}
}

func (m *machine) round(step uint32) *roundState {
	r := m.rounds[step]
	if r == nil {
		r = &roundState{}
		m.rounds[step] = r
	}
	return r
}

// member returns this node's index in the epoch if it is a healthy client.
func (m *machine) member() (uint16, bool) {
	s := m.snap
	i, ok := s.ClientIndex(m.id.Signer)
	return i, ok && s.Epoch.Clients[i].State == coordinator.Healthy
}

// dropped reports whether the epoch trains without this node: what it
// would fetch is the epoch's results, which it no longer needs (it loads
// the model anew when it joins the next epoch), from peers that may ignore
// it.
func (m *machine) dropped() bool {
	if m.snap == nil || (m.snap.RunState != coordinator.RoundTrain && m.snap.RunState != coordinator.RoundWitness) {
		return false
	}
	_, ok := m.member()
	return !ok
}

// cur is the book of the snapshot's epoch.
func (m *machine) cur() *epochBook { return m.bookFor(m.snap.Progress.Epoch) }

// snapshot takes a new coordinator state.
func (m *machine) snapshot(s *coordinator.Coordinator) Ready {
	m.snap = s
	m.dueSince = 0 // whatever was due may have happened: count the turn anew
	var rd Ready
	book := m.cur()
	if s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness && s.RunState != coordinator.Cooldown && m.hasDue() {
		// The epoch ended with results still missing: apply what there is
		// (this marks the model as diverged; the driver applies before it
		// loads, so a load in the same Ready replaces it).
		m.applyDue(&rd)
	}
	switch s.RunState {
	case coordinator.Finished:
		rd.Done = "the run is finished"
	case coordinator.WaitingForMembers:
		if m.epochs > 0 && m.trained >= m.epochs {
			unit := "epochs"
			if m.epochs == 1 {
				unit = "epoch"
			}
			rd.Done = fmt.Sprintf("trained the %d %s asked for", m.epochs, unit)
			break
		}
		if _, pending := s.PendingIndex(m.id.Signer); !pending && !book.joined && m.joinTurn(s) {
			book.joined = true
			rd.Send = append(rd.Send, &coordinator.JoinRun{ID: m.id})
		}
	case coordinator.Warmup:
		if _, ok := m.member(); !ok {
			break
		}
		if !book.ready {
			rd.Load = m.loadWork()
			break
		}
		m.warmupWitness(&rd)
	case coordinator.RoundTrain, coordinator.RoundWitness:
		if m.dropped() && len(m.fetching) > 0 {
			clear(m.fetching)
			rd.DropFetches = true
		}
		m.began()
		if _, ok := m.member(); !ok || !book.ready {
			break
		}
		m.applyDue(&rd)
		if s.RunState == coordinator.RoundTrain {
			m.train(&rd)
		}
		// In either phase: a round whose witnesses are all in ends at once,
		// so a node may never see its RoundTrain.
		m.healthChecks(&rd)
		m.trainAhead(&rd)
		m.maybeWitness(&rd)
	case coordinator.Cooldown:
		m.cooldown(&rd)
	}
	m.forget()
	return rd
}

// joinTurn reports whether every trainer that joins before this one
// (joinAfter) is pending: a later snapshot asks again.
func (m *machine) joinTurn(s *coordinator.Coordinator) bool {
	for _, k := range m.joinAfter {
		if _, pending := s.PendingIndex(k); !pending {
			return false
		}
	}
	return true
}

// loadWork asks for the model of the snapshot's epoch. The model in memory
// may stay only if this node ended the previous epoch as a client with every
// result applied and the run says to use peers.
func (m *machine) loadWork() *LoadWork {
	s := m.snap
	m.cur() // turn the page: prev is the epoch before
	keep := s.Progress.Epoch > 0 && m.prev.epoch == s.Progress.Epoch-1 && m.prev.held &&
		s.Model.Checkpoint.Kind == coordinator.CheckpointP2P
	m.ahead = nil // the model is replaced (or kept, but a new epoch's rounds are not the ones guessed)
	return &LoadWork{Epoch: s.Progress.Epoch, Keep: keep, State: s}
}

// cooldown finishes the epoch's applies, then marks the model as held and,
// if this node is an elected checkpointer, asks to save it.
func (m *machine) cooldown(rd *Ready) {
	book := m.cur()
	if !book.ready {
		return
	}
	m.applyDue(rd)
	if m.hasDue() || rd.Apply != nil {
		return // the next event (a fetch, the tick) finishes the applies
	}
	i, ok := m.member()
	if !ok {
		return
	}
	s := m.snap
	if !book.held && !m.diverged {
		book.held = true // this node holds the epoch's final model
		next := s.Progress.Epoch + 1
		rd.Share = &next
	}
	if !book.counted {
		book.counted = true
		m.trained++
	}
	if !book.saved && !m.diverged && s.IsCheckpointer(i) {
		book.saved = true
		rd.Save = &SaveWork{Epoch: s.Progress.Epoch, Step: s.Progress.Step, Store: s.Model.Store}
	}
}

// loaded says the model for epoch is ready.
func (m *machine) loaded(epoch uint32) Ready {
	m.bookFor(epoch).ready = true
	m.diverged = false
	var rd Ready
	if m.snap != nil && m.snap.RunState == coordinator.Warmup && m.snap.Progress.Epoch == epoch {
		m.warmupWitness(&rd)
	}
	return rd
}

// announced takes a peer's announcement (gossip or pull).
func (m *machine) announced(a p2p.Announcement) Ready {
	var rd Ready
	if m.take(a, &rd) {
		m.progress(&rd)
	}
	return rd
}

// take records an announcement and adds its fetch to rd if the result is
// wanted. It reports whether the announcement proved its trainer
// equivocated (and so changed what this node may witness and apply).
func (m *machine) take(a p2p.Announcement, rd *Ready) (evidence bool) {
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
func (m *machine) claim(a p2p.Announcement) int {
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
func (m *machine) equivocated(step uint32, start uint64) bool {
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
func (m *machine) settledWithout(step uint32, b owedBatch) bool {
	if c := m.claims[step][b.start]; c != nil && (c.equivocated || c.refused) {
		return true
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
func (m *machine) doomed(trainer coordinator.Pubkey) bool {
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
func (m *machine) distrust(trainer coordinator.Pubkey, step uint32) {
	if m.distrusted == nil {
		m.distrusted = map[coordinator.Pubkey]uint32{}
	}
	if last, ok := m.distrusted[trainer]; !ok || step > last {
		m.distrusted[trainer] = step
	}
}

// progress does what a newly settled result allows: the applies it
// unblocks, the cooldown's end, the witness report it completes.
func (m *machine) progress(rd *Ready) {
	if m.snap == nil || !m.cur().ready {
		return
	}
	if m.snap.RunState == coordinator.Cooldown {
		m.cooldown(rd)
		return
	}
	m.notePace()
	m.applyDue(rd)
	m.trainAhead(rd)
	m.maybeWitness(rd)
}

// fetched takes a fetched result: its frame, or why it failed. An invalid
// result is never fetched again; after any other failure a later
// announcement or pull of it starts a new fetch.
func (m *machine) fetched(a p2p.Announcement, f *distro.Frame, err error, invalid bool) Ready {
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

// trainStats is what a node reports about its last trained batch in its
// witness metadata (coordinator.WitnessMetadata): the batch's loss, and the
// tokens and result bytes of the batch over the seconds it took to train
// and publish it. The explorer draws the loss curve and the run's rates
// from them, so they need no service of their own.
type trainStats struct {
	loss         float32
	tokensPerSec float32
	bytesPerSec  float32
}

// trainedResult takes this node's own published result. The round before
// it may now be applied, and then the next round trained ahead.
func (m *machine) trainedResult(a p2p.Announcement, f *distro.Frame, st trainStats) Ready {
	m.copied(a, f) // its fingerprint, so that a copy of it is caught
	m.store(a, f)
	m.lastBatch = st
	m.round(a.Step).done = true
	m.heard(a.Step)
	var rd Ready
	m.progress(&rd)
	return rd
}

// tick runs once a second with the time (unix seconds, the coordinator's
// unit): it asks peers directly for results gossip has not delivered,
// retries a model load that failed (peers that were not reachable yet) and,
// WithTicking, sends a tick when its turn comes (see turnToTick).
func (m *machine) tick(now uint64) Ready {
	var rd Ready
	m.now = max(m.now, now)
	s := m.snap
	if s == nil {
		return rd
	}
	m.began()
	rd.Tick = m.turnToTick(now)
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

// fetchingClaim says whether the batch's announcement is here and its
// result is being fetched: a pull would only bring the announcement again
// (at 256 trainers, ~95 KB from every peer, a pull a second for each
// trainer). A failed fetch ends the claim's fetching, and pulls resume.
func (m *machine) fetchingClaim(step uint32, b uint64) bool {
	c := m.claims[step][b]
	return c != nil && m.fetching[c.first]
}

// tickDue runs between the one-second ticks of a node that ticks the run
// (WithTicking), with the time: it sends a tick as soon as the node's turn
// comes (turnToTick), so a transition that falls due at a whole second does
// not wait for the next one-second tick, nor a second more when the chain's
// clock was a slot behind and the first tick changed nothing. It does
// nothing else (pulls and load retries stay once a second).
func (m *machine) tickDue(now uint64) Ready {
	m.now = max(m.now, now)
	if m.snap == nil {
		return Ready{}
	}
	return Ready{Tick: m.turnToTick(now)}
}

// turnToTick reports whether to send a tick now: ticking the last snapshot
// at now would change it (the coordinator is pure, so a copy shows the
// outcome), and it is this node's turn. Every trainer would pay for a tick
// that only the first can use, so they take turns: the epoch's client at
// index i waits until the transition has been due for i seconds (others for
// one more than the clients), which costs a second per trainer that is
// gone. At most one tick is in flight.
func (m *machine) turnToTick(now uint64) bool {
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

// tickSent says the tick asked for has landed or failed.
func (m *machine) tickSent() { m.tickInFlight = false }

// pulled takes the answer to a pull.
func (m *machine) pulled(list []p2p.Announcement) Ready {
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

func (m *machine) store(a p2p.Announcement, f *distro.Frame) {
	r := m.results[a.Step]
	if r == nil {
		r = map[uint64]*result{}
		m.results[a.Step] = r
	}
	if r[a.Batch.Start] == nil {
		r[a.Batch.Start] = &result{ann: a, frame: f}
	}
}

// forget drops results and round bookkeeping that can no longer be used.
func (m *machine) forget() {
	step := m.snap.Progress.Step
	for st := range m.results {
		if rs := m.rounds[st]; st+4 < step && (rs == nil || rs.due == nil) {
			delete(m.results, st)
		}
	}
	for st := range m.claims {
		if rs := m.rounds[st]; st+4 < step && (rs == nil || rs.due == nil) {
			delete(m.claims, st)
		}
	}
	for fp, seen := range m.prints {
		if seen.step+printWindow < step {
			delete(m.prints, fp)
		}
	}
	for st, rs := range m.rounds {
		if st+4 < step && rs.due == nil {
			delete(m.rounds, st)
		}
	}
	for k, last := range m.distrusted {
		if last+distrustSteps < step {
			delete(m.distrusted, k)
		}
	}
	if len(m.rejected) > 4096 {
		clear(m.rejected) // commitments are per step; old ones cannot come back
	}
}

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
func (m *machine) train(rd *Ready) {
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
	w := &TrainWork{Step: step, Batch: p2p.BatchRange{Start: d.Start, End: d.Start + d.Count}, LR: schedule.LR(s.Model.LR, step)}
	// The guess was right (the same clients started the round): the
	// gradient trained ahead is this batch's, on this model.
	w.Reuse = ahead != nil && ahead.Step == w.Step && ahead.Batch == w.Batch
	w.Reference = m.referenceSequences()
	rd.Train = w
}

// trainAhead trains the next round's batch while this one is witnessed: its
// data assignment is known a round early (the coordinator's NextRound), and
// the model it must be trained on is the one this node holds once it has
// published this round's result and applied the round before (each round is
// applied two rounds after it is trained, so this is the order every
// trainer follows, ahead or not). If a client is dropped before the round
// starts, or the epoch ends instead, the assignment differs and train asks
// for the batch again; nothing trained ahead is published. Once a round.
func (m *machine) trainAhead(rd *Ready) {
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

// maybeWitness sends the witness report for the current round once every
// result is in, or at the latest when the round reaches RoundWitness.
func (m *machine) maybeWitness(rd *Ready) {
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

func (m *machine) warmupWitness(rd *Ready) {
	if book := m.cur(); !book.warmedUp {
		book.warmedUp = true
		m.witness(rd, true)
	}
}

// witness adds this node's (warmup) witness report if it is an elected
// witness of the current round: the trainers whose results it verified, the
// commitments of those results, and a root over them.
func (m *machine) witness(rd *Ready, warmup bool) {
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
	w.Metadata.Loss = m.lastBatch.loss
	w.Metadata.TokensPerSec = m.lastBatch.tokensPerSec
	w.Metadata.BandwidthPerSec = m.lastBatch.bytesPerSec
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
func (m *machine) healthChecks(rd *Ready) {
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
func (m *machine) applyDue(rd *Ready) {
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
func (m *machine) outvoted(r *coordinator.Round, res *result, signer coordinator.Pubkey) bool {
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
func (m *machine) hasDue() bool {
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
func (m *machine) signers(r *coordinator.Round) []coordinator.Pubkey {
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
