package machine

import (
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// Machine holds the trainer's decisions and none of its I/O, in the manner
// of raft's RawNode: each event (a coordinator snapshot, an announcement, a
// fetched or trained result, the model being ready, a timer tick, a pull
// answer) returns a Ready that says what to do; the driver (Node.Run) does it
// and reports back with more events. It is single-threaded and deterministic
// given its inputs (witness bloom keys come from newKey).
type Machine struct {
	id      coordinator.ClientID
	epochs  int  // leave after this many epochs (0: never)
	ticking bool // send ticks when a transition is due (WithTicking)
	newKey  func() uint64
	// joinAfter are the trainers that join each epoch before this one
	// (WithJoinOrder).
	joinAfter []coordinator.Pubkey
	// joinFrom is the first epoch this node joins (JoinFrom).
	joinFrom uint32
	// checkpointWait is how long a joiner asks unreachable holders for
	// the model, in seconds (CheckpointWait; 0: the run's default).
	checkpointWait uint64

	snap     *coordinator.Coordinator
	results  map[uint32]map[uint64]*result // step → batch start → first verified result
	claims   map[uint32]map[uint64]*claim  // step → batch start → what its trainer announced
	notices  map[uint32]map[noticed]bool   // step → the training notices heard (patience.go)
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
	lastBatch TrainStats             // the last trained batch: loss and rates, reported in witness metadata
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

	// now is the time of the latest tick or due check (unix seconds; 0
	// before the first).
	now uint64
	// watched counts the seconds this node has watched the run: the
	// one-second ticks it handled, each counted once however long after
	// the one before it came (patience.go); tickedAt is the latest one's
	// time.
	watched, tickedAt uint64
	// paces are the paces of the last complete rounds (patience.go), in
	// watched seconds, a ring written at paceNext.
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
	// heldAs is the model config the epoch's model had (of the run's model
	// as it then was), which the next epoch's must equal for it to be
	// kept; heldKnown is false where the run's model named no config.
	heldAs    modelspec.Config
	heldKnown bool
	saved     bool // the checkpoint was asked for
	counted   bool // counted in trained
	load      loadBook
}

// epochBook returns the book of epoch e, turning the page when e is new.
func (m *Machine) bookFor(e uint32) *epochBook {
	if m.book.epoch != e {
		m.prev, m.book = m.book, epochBook{epoch: e}
	}
	return &m.book
}

// result is a verified peer (or own) result for one batch.
type result struct {
	ann   p2p.Announcement
	frame *distro.Frame
	// misreported: the losses it reports are not what the round's model
	// gives on its batch (verify.go): this node does not vouch for it.
	misreported bool
}

type roundState struct {
	trained, witnessed, applied, checked bool
	// done: this node's training of the round is published (or it had no
	// batch, or sat the round out): the round before may now be applied
	// (see applyDue).
	done bool
	due  *dueRound // set when the round's results are due and not yet applied
	// began and heard are when this node first saw the round train and
	// when the latest of its announcements (or this node's result) came,
	// in watched seconds (patience.go); paced: its pace is recorded.
	began, heard uint64
	paced        bool
	// reference are this node's losses of the round's sampled sequences on
	// the model the round trained on (by data index); pending are sampled
	// results that came before them, to check once they are in.
	reference map[uint64]float32
	pending   []lossReport

	// satOut: this node did not train its batch (SatOut); nobody waits
	// for it.
	satOut bool
}

// dueRound keeps what deciding a round's consensus needs after the
// coordinator's ring has moved on.
type dueRound struct {
	round      coordinator.Round
	assignment []coordinator.DataRange
	signers    []coordinator.Pubkey
}

func New(id coordinator.ClientID, epochs int, ticking bool, newKey func() uint64) *Machine {
	return &Machine{id: id, epochs: epochs, ticking: ticking, newKey: newKey,
		results: map[uint32]map[uint64]*result{}, claims: map[uint32]map[uint64]*claim{}, fetching: map[coordinator.Hash]bool{},
		notices:  map[uint32]map[noticed]bool{},
		rejected: map[coordinator.Hash]bool{}, rounds: map[uint32]*roundState{}, prints: map[[32]byte]printSeen{}}
}

func (m *Machine) round(step uint32) *roundState {
	r := m.rounds[step]
	if r == nil {
		r = &roundState{}
		m.rounds[step] = r
	}
	return r
}

// member returns this node's index in the epoch if it is a healthy client.
func (m *Machine) member() (uint16, bool) {
	s := m.snap
	i, ok := s.ClientIndex(m.id.Signer)
	return i, ok && s.Epoch.Clients[i].State == coordinator.Healthy
}

// dropped reports whether the epoch trains without this node: what it
// would fetch is the epoch's results, which it no longer needs (it loads
// the model anew when it joins the next epoch), from peers that may ignore
// it.
func (m *Machine) dropped() bool {
	if m.snap == nil || (m.snap.RunState != coordinator.RoundTrain && m.snap.RunState != coordinator.RoundWitness) {
		return false
	}
	_, ok := m.member()
	return !ok
}

// JoinAfter makes this node join each epoch only once the trainers after
// have joined it (pending), so that a driver's trainers join in one order.
func (m *Machine) JoinAfter(after []coordinator.Pubkey) { m.joinAfter = after }

// JoinFrom makes this node join no epoch before epoch: until then it
// follows the run without a part in it. A node started with the run joins
// a later epoch this way at the same point of the run every time, where
// one started once the run is seen to be far enough along joins wherever
// it has got to by then.
func (m *Machine) JoinFrom(epoch uint32) { m.joinFrom = epoch }

// cur is the book of the snapshot's epoch.
func (m *Machine) cur() *epochBook { return m.bookFor(m.snap.Progress.Epoch) }

// Snapshot takes a new coordinator state at now (unix seconds, the driver's clock: whether it is this node's turn to tick, Ready.Tick).
func (m *Machine) Snapshot(s *coordinator.Coordinator, now uint64) Ready {
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
		if _, pending := s.PendingIndex(m.id.Signer); !pending && !book.joined && s.Progress.Epoch >= m.joinFrom && m.joinTurn(s) {
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
	if m.ticking {
		// A transition that an instruction made due (the last witness
		// report is in: the round ends at the next tick) is ticked now,
		// not at the next check.
		rd.Tick = m.TurnToTick(now)
	}
	return rd
}

// joinTurn reports whether every trainer that joins before this one
// (joinAfter) is pending: a later snapshot asks again.
func (m *Machine) joinTurn(s *coordinator.Coordinator) bool {
	for _, k := range m.joinAfter {
		if _, pending := s.PendingIndex(k); !pending {
			return false
		}
	}
	return true
}

// cooldown finishes the epoch's applies, then marks the model as held and,
// if this node is an elected checkpointer, asks to save it.
func (m *Machine) cooldown(rd *Ready) {
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
		cfg, err := modelspec.ModelConfig(&s.Model)
		book.heldAs, book.heldKnown = cfg, err == nil
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

// Loaded says the model for epoch is ready.
func (m *Machine) Loaded(epoch uint32) Ready {
	m.bookFor(epoch).ready = true
	m.diverged = false
	var rd Ready
	if m.snap != nil && m.snap.RunState == coordinator.Warmup && m.snap.Progress.Epoch == epoch {
		m.warmupWitness(&rd)
	}
	return rd
}

// progress does what a newly settled result allows: the applies it
// unblocks, the cooldown's end, the witness report it completes.
func (m *Machine) progress(rd *Ready) {
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

// forget drops results and round bookkeeping that can no longer be used.
func (m *Machine) forget() {
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
	for st := range m.notices {
		if st < step {
			delete(m.notices, st) // only the current round's are asked about
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
