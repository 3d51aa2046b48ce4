package federated

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated/dp"
)

// Update is one client's accepted contribution, waiting in the buffer.
type Update struct {
	Client coordinator.Pubkey
	Base   uint64 // the round the client trained on
	Steps  uint32 // local steps it trained
	Delta  []float32
}

// State is everything a federated run holds; it is what is persisted.
type State struct {
	Config Config
	// Round is the model's version: the aggregations done so far.
	Round uint64
	// Contributions counts the updates aggregated into the model.
	Contributions uint64
	// PrivacyFrom is the round since which the privacy settings (clip,
	// noise, population, δ) have been what they are: the accountant
	// covers rounds under one setting only, so rounds before it void the
	// guarantee.
	PrivacyFrom uint64
	Model       []float32
	Buffer      []Update
	// Seqs is the last sequence number used by each signer whose request
	// was accepted (replay protection, as the server's own requests have).
	Seqs map[coordinator.Pubkey]uint64
	// Members are the clients that joined the run: only they push.
	Members map[coordinator.Pubkey]bool
	// Owner is the authority of the coordinator run this state belongs to
	// (the driver's: a run freed and created again by someone else under
	// the same id does not inherit it).
	Owner coordinator.Pubkey
	// Contributed is, for each member whose update was ever aggregated,
	// the round its last one made (1..Round): the clients that took part
	// in earlier rounds, whom the driver lets no fresh key crowd out of a
	// secure aggregation round (RecentContributors).
	Contributed map[coordinator.Pubkey]uint64
}

// Clone copies the state; updates' deltas, never written after they are
// accepted, are shared.
func (s *State) Clone() *State {
	c := *s
	c.Model = slices.Clone(s.Model)
	c.Buffer = slices.Clone(s.Buffer)
	c.Seqs = make(map[coordinator.Pubkey]uint64, len(s.Seqs))
	for k, v := range s.Seqs {
		c.Seqs[k] = v
	}
	c.Members = maps.Clone(s.Members)
	c.Contributed = maps.Clone(s.Contributed)
	return &c
}

// RecentRounds is how far back a contribution makes a client recent
// (RecentContributors): one of the last 3 aggregations.
const RecentRounds = 3

// Contributor reports whether k's update was aggregated in an earlier
// round.
func (s *State) Contributor(k coordinator.Pubkey) bool { return s.Contributed[k] > 0 }

// RecentContributors counts the clients whose update was aggregated into
// one of the last rounds rounds (RecentRounds, or fewer): those a secure
// aggregation round keeps slots for in an open run (fresh keys take only
// the rest).
func (s *State) RecentContributors(rounds int) int {
	n := 0
	for _, r := range s.Contributed {
		if r > 0 && s.Round-r < uint64(max(rounds, 0)) {
			n++
		}
	}
	return n
}

// Finished reports whether the run has done its rounds.
func (s *State) Finished() bool { return s.Config.Rounds > 0 && s.Round >= uint64(s.Config.Rounds) }

// Msg is an input to Machine.Step.
type Msg interface{ isMsg() }

// Push is a client's update of the model of round Base.
type Push struct {
	Client coordinator.Pubkey
	Seq    uint64
	Base   uint64
	Steps  uint32
	Delta  []float32 // the machine keeps it: the caller must not write it afterwards
	// Noise seeds central DP's noise if this push completes a buffer (the
	// driver draws it from crypto/rand).
	Noise [32]byte
}

// Configure replaces the run's config (the model, round and buffer stay; a
// smaller capacity aggregates at the next push).
type Configure struct {
	Signer coordinator.Pubkey
	Seq    uint64
	Config Config
}

// SumPush is a secure aggregation round's outcome: the mean of the
// updates of Clients, trained on round Base, which the server never saw one
// by one (they were clipped by the clients). Central DP's noise is added as
// for a buffer.
type SumPush struct {
	Clients []coordinator.Pubkey
	Base    uint64
	Mean    []float32
	Noise   [32]byte
	// Quantum is the fixed-point step the round's sum was encoded with
	// (2^-F): what the mean's norm may pass Clip by through rounding.
	Quantum float64
}

// Join makes Client a member of the run. The driver has checked that it may
// join (where the run has a join authority, that the authority signed for
// it); the machine bounds the members (MaxMembers).
type Join struct {
	Client coordinator.Pubkey
	Seq    uint64
}

func (Push) isMsg()      {}
func (Configure) isMsg() {}
func (SumPush) isMsg()   {}
func (Join) isMsg()      {}

// IsMember reports whether k joined the run (or configured it).
func (s *State) IsMember(k coordinator.Pubkey) bool {
	return s.Members[k]
}

// Aggregated describes one aggregation.
type Aggregated struct {
	Round   uint64 // the new round
	Updates int
	Clients []coordinator.Pubkey
	// Norm is the L2 norm of the step applied to the model.
	Norm float64
	// Dropped: the step would have made the model non-finite, so it was
	// not applied (Round is the unchanged round; the updates are gone).
	Dropped bool
}

// Ready is what the driver must do after Step, in order: persist the state
// (before any reply goes out: an acknowledged update must survive a crash),
// then publish each aggregation (serve the new model, wake waiters, count
// metrics).
type Ready struct {
	Persist    bool
	Aggregated []Aggregated
}

// Machine is a federated run's pure state machine.
type Machine struct {
	s     *State
	ready Ready
}

// New starts a run from its initial model.
func New(cfg Config, model []float32) (*Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(model) == 0 || len(model) > MaxParams {
		return nil, fmt.Errorf("%w: a model of %d values (1..%d)", ErrShape, len(model), MaxParams)
	}
	return &Machine{s: &State{Config: cfg, Model: slices.Clone(model), Seqs: map[coordinator.Pubkey]uint64{},
		Members: map[coordinator.Pubkey]bool{}, Contributed: map[coordinator.Pubkey]uint64{}},
		ready: Ready{Persist: true}}, nil
}

// Restore resumes a persisted state (which the machine then owns).
func Restore(s *State) (*Machine, error) {
	if err := s.Config.Validate(); err != nil {
		return nil, err
	}
	for _, u := range s.Buffer {
		if len(u.Delta) != len(s.Model) {
			return nil, fmt.Errorf("%w: a buffered update has %d values, the model %d", ErrShape, len(u.Delta), len(s.Model))
		}
	}
	if s.Members == nil {
		s.Members = map[coordinator.Pubkey]bool{}
	}
	if s.Seqs == nil {
		s.Seqs = map[coordinator.Pubkey]uint64{}
	}
	if s.Contributed == nil {
		s.Contributed = map[coordinator.Pubkey]uint64{}
	}
	return &Machine{s: s}, nil
}

// State is the machine's state; callers must not modify it.
func (m *Machine) State() *State { return m.s }

// Ready returns what the last steps asked of the driver.
func (m *Machine) Ready() Ready { return m.ready }

// Advance acknowledges the Ready.
func (m *Machine) Advance() { m.ready = Ready{} }

// HasReady reports whether there is anything to do.
func (m *Machine) HasReady() bool { return m.ready.Persist || len(m.ready.Aggregated) > 0 }

// Step applies one message. A refusal is an error and changes nothing, not
// even the replay table: a stranger's refused requests cost no state and no
// write (2,000 refused pushes from fresh keys used to add an entry each and
// rewrite the whole state every time). A refused request presented again is
// judged again on the state then; if it is accepted then, it is its
// signer's own, once, as its sequence number is recorded on acceptance.
func (m *Machine) Step(msg Msg) error {
	switch msg := msg.(type) {
	case Join:
		if err := m.checkSeq(msg.Client, msg.Seq); err != nil {
			return err
		}
		if !m.s.IsMember(msg.Client) && len(m.s.Members) >= MaxMembers {
			return fmt.Errorf("%w: %d", ErrFull, MaxMembers)
		}
		m.s.Members[msg.Client] = true
		m.recordSeq(msg.Client, msg.Seq)
		return nil
	case Push:
		if !m.s.IsMember(msg.Client) {
			return ErrNotMember
		}
		if err := m.checkSeq(msg.Client, msg.Seq); err != nil {
			return err
		}
		if err := m.push(msg); err != nil {
			return err
		}
		m.recordSeq(msg.Client, msg.Seq)
		return nil
	case SumPush:
		return m.sumPush(msg)
	case Configure:
		if err := m.checkSeq(msg.Signer, msg.Seq); err != nil {
			return err
		}
		if err := msg.Config.Validate(); err != nil {
			return err
		}
		if msg.Config.SecAgg != m.s.Config.SecAgg && len(m.s.Buffer) > 0 {
			return fmt.Errorf("%w: secure aggregation cannot be switched while %d updates wait in the buffer", ErrConfig, len(m.s.Buffer))
		}
		old := m.s.Config
		if old.Clip != msg.Config.Clip || old.NoiseMultiplier != msg.Config.NoiseMultiplier || old.Population != msg.Config.Population ||
			old.Capacity != msg.Config.Capacity || old.LocalNoiseMultiplier != msg.Config.LocalNoiseMultiplier || old.Delta != msg.Config.Delta {
			m.s.PrivacyFrom = m.s.Round
		}
		m.recordSeq(msg.Signer, msg.Seq)
		m.s.Config = msg.Config
		m.maybeAggregate([32]byte{})
		return nil
	default:
		return fmt.Errorf("federated: unknown message %T", msg)
	}
}

// checkSeq refuses a sequence number its signer has used (or passed).
func (m *Machine) checkSeq(who coordinator.Pubkey, seq uint64) error {
	if seq <= m.s.Seqs[who] {
		return ErrReplay
	}
	return nil
}

// recordSeq records an accepted request's sequence number.
func (m *Machine) recordSeq(who coordinator.Pubkey, seq uint64) {
	m.s.Seqs[who] = seq
	m.ready.Persist = true
}

func (m *Machine) sumPush(p SumPush) error {
	s := m.s
	switch {
	case !s.Config.SecAgg:
		return fmt.Errorf("%w: a secure aggregation result for a run without it", ErrEncoding)
	case s.Finished():
		return ErrFinished
	case p.Base != s.Round:
		return &StaleError{Base: p.Base, Round: s.Round}
	case len(p.Mean) != len(s.Model):
		return fmt.Errorf("%w: %d values, the model has %d", ErrShape, len(p.Mean), len(s.Model))
	case len(p.Clients) < int(s.Config.SecAggThreshold):
		return fmt.Errorf("%w: %d clients, threshold %d", ErrShape, len(p.Clients), s.Config.SecAggThreshold)
	}
	for _, c := range p.Clients {
		if !s.IsMember(c) {
			return fmt.Errorf("%w: %s took part in the secure aggregation round", ErrNotMember, c)
		}
	}
	// The server cannot see one masked input, but the mean of updates each
	// clipped to Clip has a norm of at most Clip: a larger one means some
	// input was no clipped update (three strangers with random inputs once
	// made a step of norm 3,669 with clip 1), and the round is refused.
	if n, bound := l2(p.Mean), float64(s.Config.Clip)+p.Quantum*math.Sqrt(float64(len(p.Mean))); n > bound {
		return fmt.Errorf("%w: its norm %.4g exceeds clip %g, so some input was not a clipped update", ErrNotClipped, n, s.Config.Clip)
	}
	step := slices.Clone(p.Mean)
	if s.Config.NoiseMultiplier > 0 {
		dp.NewNoise(p.Noise).Add(step, float64(s.Config.NoiseMultiplier)*float64(s.Config.Clip)/float64(len(p.Clients)))
	}
	m.apply(step, slices.Clone(p.Clients))
	return nil
}

func (m *Machine) push(p Push) error {
	s := m.s
	switch {
	case s.Config.SecAgg:
		return fmt.Errorf("%w: this run takes masked updates only (secure aggregation)", ErrEncoding)
	case s.Finished():
		return ErrFinished
	case p.Base > s.Round:
		return fmt.Errorf("%w: round %d, the server is at %d", ErrFuture, p.Base, s.Round)
	case s.Round-p.Base > uint64(s.Config.MaxStaleness):
		return &StaleError{Base: p.Base, Round: s.Round, MaxStaleness: s.Config.MaxStaleness}
	case len(p.Delta) != len(s.Model):
		return fmt.Errorf("%w: %d values, the model has %d", ErrShape, len(p.Delta), len(s.Model))
	case p.Steps < 1 || p.Steps > MaxRoundDuration:
		return fmt.Errorf("%w: %d local steps", ErrShape, p.Steps)
	}
	for _, v := range p.Delta {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return ErrNonFinite
		}
		if math.Abs(float64(v)) > MaxUpdateValue {
			return fmt.Errorf("%w: %g", ErrTooLarge, v)
		}
	}
	for _, u := range s.Buffer {
		if u.Client == p.Client && u.Base == p.Base {
			return ErrDuplicate
		}
	}
	s.Buffer = append(s.Buffer, Update{Client: p.Client, Base: p.Base, Steps: p.Steps, Delta: p.Delta})
	m.maybeAggregate(p.Noise)
	return nil
}

func (m *Machine) maybeAggregate(noise [32]byte) {
	s := m.s
	if len(s.Buffer) < int(s.Config.Capacity) || s.Finished() {
		return
	}
	step := Combine(&s.Config, s.Round, s.Buffer, len(s.Model), noise)
	clients := make([]coordinator.Pubkey, len(s.Buffer))
	for i, u := range s.Buffer {
		clients[i] = u.Client
	}
	s.Buffer = nil
	m.apply(step, clients)
}

// apply adds an aggregated step to the model and bumps the round. A step
// that would leave a weight NaN or infinite is dropped instead (the model
// and round stay, Aggregated.Dropped says so): a non-finite model is never
// stored or served, whatever the updates were.
func (m *Machine) apply(step []float32, clients []coordinator.Pubkey) {
	s := m.s
	lr := s.Config.ServerLR
	if lr == 0 {
		lr = 1
	}
	next := make([]float32, len(s.Model))
	var norm float64
	for i, v := range step {
		d := lr * v
		next[i] = s.Model[i] + d
		if math.IsNaN(float64(next[i])) || math.IsInf(float64(next[i]), 0) {
			m.ready.Persist = true
			m.ready.Aggregated = append(m.ready.Aggregated, Aggregated{Round: s.Round, Updates: len(clients), Clients: clients, Dropped: true})
			return
		}
		norm += float64(d) * float64(d)
	}
	s.Model = next
	a := Aggregated{Round: s.Round + 1, Updates: len(clients), Norm: math.Sqrt(norm), Clients: clients}
	s.Round++
	s.Contributions += uint64(len(clients))
	for _, c := range clients {
		s.Contributed[c] = s.Round
	}
	m.ready.Persist = true
	m.ready.Aggregated = append(m.ready.Aggregated, a)
}

// Combine is the aggregation of a buffer at the server's round: each update
// is clipped to cfg.Clip (if set; not in a run with local noise only, whose
// clients clipped before adding their noise, which a second clipping would
// shrink), weighted by its staleness, combined by
// cfg.Aggregation, and central DP's noise N(0, (σ·Clip/k)²) is added with
// the stream of seed noise. It does not modify the updates.
func Combine(cfg *Config, round uint64, buf []Update, n int, noise [32]byte) []float32 {
	deltas := make([][]float32, len(buf))
	weights := make([]float64, len(buf))
	for i, u := range buf {
		d := u.Delta
		if cfg.Clip > 0 && (cfg.NoiseMultiplier > 0 || cfg.LocalNoiseMultiplier == 0) {
			d = slices.Clone(d)
			dp.Clip(d, float64(cfg.Clip))
		}
		deltas[i] = d
		weights[i] = 1 / math.Sqrt(1+float64(round-u.Base))
	}
	out := make([]float32, n)
	switch cfg.Aggregation {
	case Median:
		col := make([]float32, len(deltas))
		for j := range out {
			for i, d := range deltas {
				col[i] = d[j]
			}
			sort.Slice(col, func(a, b int) bool { return col[a] < col[b] })
			k := len(col)
			if k%2 == 1 {
				out[j] = col[k/2]
			} else {
				out[j] = (col[k/2-1] + col[k/2]) / 2
			}
		}
	case ClippedMean:
		norms := make([]float64, len(deltas))
		for i, d := range deltas {
			norms[i] = l2(d)
		}
		med := slices.Clone(norms)
		slices.Sort(med)
		bound := med[(len(med)-1)/2]
		for i := range deltas {
			if norms[i] > bound && norms[i] > 0 {
				weights[i] *= bound / norms[i]
			}
		}
		fallthrough
	default:
		var total float64
		for i := range buf {
			if cfg.Aggregation == ClippedMean {
				total += 1 / math.Sqrt(1+float64(round-buf[i].Base))
			} else {
				total += weights[i]
			}
		}
		for i, d := range deltas {
			w := float32(weights[i] / total)
			for j, v := range d {
				out[j] += w * v
			}
		}
	}
	if cfg.NoiseMultiplier > 0 && cfg.Clip > 0 {
		dp.NewNoise(noise).Add(out, float64(cfg.NoiseMultiplier)*float64(cfg.Clip)/float64(len(buf)))
	}
	return out
}

func l2(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// Privacy is the (ε, δ) central and local DP guarantees after the rounds
// done so far: +Inf where there is none (no noise, clipping off, or rounds
// played under other privacy settings, which the accountant does not
// cover).
func (s *State) Privacy() (central, local float64, err error) {
	c := &s.Config
	spent := func(sigma float32, q float64, steps uint64) (float64, error) {
		if sigma == 0 || c.Clip == 0 || s.PrivacyFrom > 0 {
			return math.Inf(1), nil
		}
		e, _, err := dp.Accountant{Q: q, Sigma: float64(sigma)}.Spent(steps, c.DeltaOrDefault())
		return e, err
	}
	if central, err = spent(c.NoiseMultiplier, c.SamplingRate(), s.Round); err != nil {
		return 0, 0, err
	}
	// A client's local noise protects each of its updates on its own; it
	// sends at most one per round.
	local, err = spent(c.LocalNoiseMultiplier, 1, s.Round)
	return central, local, err
}
