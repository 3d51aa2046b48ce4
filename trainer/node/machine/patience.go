package machine

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// How long a witness waits for a silent trainer: one that has announced no
// result of the round while every other trainer's result is in (or settled).
//
// Before this, a witness waited for every owed batch until the round's
// training limit (max_round_train_time), so a trainer that joined, trained
// and never announced its result held every round it was in to that limit:
// in a virtual-time localnet of four, one such trainer cut a run of two
// epochs from 45 steps to 7, and with examples/run.toml's limits each
// silent trainer costs 240 s of a 3,600 s epoch.
//
// The rule: once the results of the round are all in but those of trainers
// that have announced nothing, the witness waits at most
//
//	patience = max(floor, patienceFactor × pace)
//
// after the last of them came, and then reports without the silent ones,
// who are then left out of the round and dropped by the next round's health
// checks (and sit out the next epoch: coordinator.SittingOut). floor is
// max(patienceFloorMin, max_round_train_time / patienceFloorDivisor); pace
// is the longest an announcement of a round took to come after that round
// began, over this round so far and the last paceRounds rounds in which
// every trainer announced. An honest slow trainer sets the pace itself:
// while it is late by about the same every round it keeps its place (it
// may be up to patienceFactor times later than the slowest of the last
// rounds, or 1 + patienceFactor times slower than the others in a round
// that nobody trained ahead); the training limit still bounds everything.
// A batch whose announcement came is never given up on here: its fetch has
// its own limits, and a result that fails its checks settles the batch.
//
// Nor is a batch whose trainer has said it trains it: a signed training
// notice (p2p.Notice, Noticed), which a trainer gossips when it begins its
// batch (or, for a batch it trained ahead, when it sees the round begin).
// A witness waits for such a batch's result as for an announced one, up to
// the round's training limit. Without it a witness could not tell a slow
// trainer from a silent one: a trainer starved of CPU on an overloaded
// machine (a localnet of three PyTorch trainers on two cores) announced
// its result 3.4 s after the last other one, past the patience, and was
// dropped. The patience rule still ends rounds quickly for trainers that
// said nothing at all (crashed, gone). A trainer that sends notices and
// never a result holds the rounds it is in to the training limit, until a
// health check drops it: the first round it fails, since the witnesses
// leave it out of that round's reports. A notice is about one batch and
// says nothing of how fast results come: the pace counts results only, so
// a notice neither shortens nor lengthens the patience for others.
//
// Every time here is counted in the seconds this node has watched the
// run: its one-second ticks (Tick), each counted once, however long after
// the one before it came. A node's loop is busy at times (loading a model,
// which for a PyTorch engine starts a worker process; training, applying)
// and handles no tick meanwhile; when it comes back, the time on the clock
// has moved by the whole stall. Measured on the clock, a stall of a few
// seconds spent the whole patience at once: a round that began while the
// node loaded (stamped with the last tick's time, seconds stale) was out
// of patience at the first tick after the load, and the witness reported
// without the trainers that were still training, so an honest trainer was
// dropped (half of the PyTorch localnets did this). Counted in watched
// seconds, a stall costs one second of patience, and a witness gives up on
// a trainer only after watching for it. A time is the count of the last
// tick before it, so the second in which the last result came is not
// counted: patience is that many whole seconds watched after it (counting
// it, a round's arrivals just before a tick left a witness half its
// patience, and a trainer 1.3 s behind the others in one round of a busy
// machine was dropped). The rule lives in the trainer and
// not in the coordinator because only a trainer sees when results arrive.
// Witnesses that see different arrival times may disagree about a late
// trainer, as they already did at the training limit; the quorum decides.
const (
	// patienceFactor multiplies the observed pace.
	patienceFactor = 2
	// patienceFloorMin is the least patience, in seconds. The clock's
	// resolution is a second, and a result in flight when it moves must
	// not be given up on: a virtual-time run's clock moves when nothing is
	// marked as work for its settle period, which a message in flight
	// between two trainers is not (quietclock). At 1 s, a trainer whose
	// results came a second after the others' was dropped (the late
	// adversary, TestLateTrainerKeepsItsPlace); each second more costs one
	// step of a virtual-time localnet for each silent trainer.
	patienceFloorMin = 2
	// patienceFloorDivisor: the floor is at least max_round_train_time over
	// this (15 s of examples/run.toml's 240 s).
	patienceFloorDivisor = 16
	// paceRounds is how many complete rounds' paces a node remembers.
	paceRounds = 8
)

// patienceFloor is the least time a witness waits for a silent trainer.
func patienceFloor(c *coordinator.Config) uint64 {
	return max(patienceFloorMin, c.MaxRoundTrainTime/patienceFloorDivisor)
}

// watch counts a one-second tick at now among the watched seconds: once,
// however long after the one before it came (see above), and never twice
// for the same second.
func (m *Machine) watch(now uint64) {
	if now > m.tickedAt {
		m.tickedAt = now
		m.watched++
	}
}

// heard records that something of step's round (an announcement, this
// node's own result) arrived now.
func (m *Machine) heard(step uint32) {
	if rs := m.round(step); m.watched > rs.heard {
		rs.heard = m.watched
	}
}

// began records when this node first saw the current round train.
func (m *Machine) began() {
	s := m.snap
	if s.RunState != coordinator.RoundTrain || m.watched == 0 {
		return
	}
	if rs := m.round(s.Progress.Step); rs.began == 0 {
		rs.began = m.watched
	}
}

// notePace records the current round's pace (how long after it began its
// last announcement came) once every owed batch has been announced, or
// has its result here: a round in which nobody was silent.
func (m *Machine) notePace() {
	s := m.snap
	if s == nil || s.RunState != coordinator.RoundTrain {
		return
	}
	step := s.Progress.Step
	rs := m.round(step)
	if rs.paced || rs.began == 0 {
		return
	}
	for _, b := range owedBatches(s, s.CurrentRound()) {
		if m.results[step][b.start] == nil && m.claims[step][b.start] == nil {
			return
		}
	}
	rs.paced = true
	m.paces[m.paceNext] = rs.heard - min(rs.heard, rs.began)
	m.paceNext = (m.paceNext + 1) % paceRounds
}

// pace is the longest pace of the last complete rounds.
func (m *Machine) pace() uint64 {
	var p uint64
	for _, x := range m.paces {
		p = max(p, x)
	}
	return p
}

// silent reports whether batch b of step has had no announcement at all
// (nor, for this node's own batch, its result), and no training notice of
// its trainer: its trainer has said nothing of it.
func (m *Machine) silent(step uint32, b owedBatch) bool {
	return b.trainer != m.id.Signer && m.claims[step][b.start] == nil && m.results[step][b.start] == nil &&
		!m.notices[step][noticed{start: b.start, trainer: b.trainer}]
}

// noticed is a batch (by its start) and the trainer whose notice said it
// trains it.
type noticed struct {
	start   uint64
	trainer coordinator.Pubkey
}

// Noticed takes a peer's training notice: from then on the batch is not
// silent (see above) if the notice's trainer is the one the batch is
// assigned to when the witness asks; a notice from anyone else is kept but
// never matches. Only notices of the current round and the next are kept
// (one may come before the snapshot that starts its round). It changes
// nothing at once: a witness that waits for a silent batch waits on.
func (m *Machine) Noticed(n p2p.Notice) Ready {
	if n.Trainer == m.id || m.snap == nil || m.dropped() {
		return Ready{}
	}
	if cur := m.snap.Progress.Step; n.Step < cur || n.Step > cur+1 {
		return Ready{}
	}
	byBatch := m.notices[n.Step]
	if byBatch == nil {
		byBatch = map[noticed]bool{}
		m.notices[n.Step] = byBatch
	}
	if len(byBatch) < coordinator.MaxClients {
		byBatch[noticed{start: n.Batch.Start, trainer: n.Trainer.Signer}] = true
	}
	return Ready{}
}

// outOfPatience reports whether this node has waited long enough for the
// silent trainers of the current round (see the rule above).
func (m *Machine) outOfPatience() bool {
	s := m.snap
	rs := m.round(s.Progress.Step)
	if rs.began == 0 || m.watched == 0 {
		return false
	}
	last := max(rs.heard, rs.began)
	wait := max(patienceFloor(&s.Config), patienceFactor*max(last-rs.began, m.pace()))
	// last is the watched second in which the last result came, anywhere
	// in it: only the seconds watched after it count whole.
	return m.watched > last+wait
}
