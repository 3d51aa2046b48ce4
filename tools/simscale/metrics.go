package simscale

import (
	"crypto/sha256"
	"encoding/binary"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// metrics collects what the report needs, by step (the step a round
// trains). Rounds 2 .. Rounds-1 are measured: the first two apply nothing
// and train nothing ahead.
type metrics struct {
	started, roundEnd        map[uint32]time.Duration
	lastPublish, lastResult  map[uint32]time.Duration
	witnessesIn              map[uint32]time.Duration
	applies, applyFrames     map[uint32]int
	missing                  int
	witnessReports           map[uint32]int
	quorumMisses             map[uint32]int // clients a round's witnesses did not count to a quorum
	quorumFails              int            // rounds that ended with fewer witnesses than the quorum
	bloomHits, bloomProbes   int
	healthDrops, healthRefus int
	// ix counts instructions the server applied in measured rounds, by
	// cost label, and refused by name.
	ix, refused map[string]int
	// tickFrom is the state and step before the tick being run.
	tickFrom     coordinator.RunState
	tickStep     uint32
	snapshots    uint64
	slowStreams  uint64
	pulls        uint64
	reannounced  uint64
	first, last  uint32 // measured steps
	windowStart  []traffic
	windowStartT time.Duration
	windowSet    bool
}

func (m *metrics) init(rounds int) {
	*m = metrics{started: map[uint32]time.Duration{}, roundEnd: map[uint32]time.Duration{}, lastPublish: map[uint32]time.Duration{},
		lastResult: map[uint32]time.Duration{}, witnessesIn: map[uint32]time.Duration{}, applies: map[uint32]int{}, applyFrames: map[uint32]int{},
		witnessReports: map[uint32]int{}, quorumMisses: map[uint32]int{}, ix: map[string]int{}, refused: map[string]int{},
		first: 2, last: uint32(rounds - 1)}
}

func (m *metrics) measured(step uint32) bool { return step >= m.first && step <= m.last }

func (m *metrics) published(step uint32, at time.Duration) {
	m.lastPublish[step] = max(m.lastPublish[step], at)
}
func (m *metrics) allResults(step uint32, at time.Duration) {
	m.lastResult[step] = max(m.lastResult[step], at)
}

func (m *metrics) applied(step uint32, frames, missing int) {
	m.applies[step]++
	m.applyFrames[step] += frames
	m.missing += missing
}

// roundStart marks a round's start; the first measured one opens the
// traffic window.
func (m *metrics) roundStart(step uint32, at time.Duration, hosts []host) {
	m.started[step] = at
	if step == m.first && !m.windowSet {
		m.windowSet = true
		m.windowStartT = at
		for _, h := range hosts {
			m.windowStart = append(m.windowStart, h.traffic)
		}
	}
}

// instruction counts one instruction the server took or refused.
func (m *metrics) instruction(sv *server, ix coordinator.Instruction, from coordinator.RunState, err error) {
	st := sv.state
	step := st.Progress.Step
	if err != nil {
		if m.measured(step) {
			m.refused[ix.Name()]++
		}
		if _, ok := ix.(*coordinator.HealthCheck); ok {
			m.healthRefus++
		}
		return
	}
	switch ix.(type) {
	case *coordinator.WitnessRound:
		m.witnessesIn[step] = sv.s.sched.now
	case *coordinator.HealthCheck:
		m.healthDrops++
	}
	if m.measured(step) {
		m.ix[costLabel(ix.Name(), from.String(), st.RunState.String())]++
	}
}

func (m *metrics) beforeTick(sv *server) {
	m.tickFrom, m.tickStep = sv.state.RunState, sv.state.Progress.Step
}

// tick counts a tick that changed the run and, when it ended a round,
// judges that round's witness reports: how many there were, which clients
// fell short of the quorum, and how often each participant bloom holds a
// member never added to it.
func (m *metrics) tick(sv *server) {
	st := sv.state
	if m.measured(m.tickStep) {
		m.ix[costLabel("tick", m.tickFrom.String(), st.RunState.String())]++
	}
	if m.tickFrom != coordinator.RoundWitness || st.Progress.Step != m.tickStep+1 {
		return
	}
	ended := m.tickStep
	m.roundEnd[ended] = sv.s.sched.now
	r := st.RoundAtHeight(ended - st.Epoch.StartStep)
	if r == nil || !m.measured(ended) {
		return
	}
	m.witnessReports[ended] = int(r.WitnessesLen)
	quorum := coordinator.Quorum(st.Config.WitnessCount(r.ClientsLen))
	if uint16(r.WitnessesLen) < quorum {
		m.quorumFails++
	}
	for _, t := range sv.s.trainers {
		if coordinator.HealthScore(r, t.id.Signer) < quorum {
			m.quorumMisses[ended]++
		}
	}
	for i := 0; i < int(r.WitnessesLen); i++ {
		w := &r.Witnesses[i]
		for p := 0; p < sv.s.cfg.BloomProbes; p++ {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(p))
			stranger := coordinator.ParticipantMember(sha256.Sum256(append([]byte("not a client"), b[:]...)))
			m.bloomProbes++
			if w.Participants.Has(w.Key, stranger) {
				m.bloomHits++
			}
		}
	}
}
