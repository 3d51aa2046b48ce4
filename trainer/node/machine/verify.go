package machine

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/schedule"
)

// The rules of verified work and why these thresholds: docs/security.md.
const (
	scoreWindow       = 8 // the work test's
	workFailing       = 4
	scoreClear        = 2
	assignmentWindow  = 12
	assignmentFailing = 8
	assignmentClear   = 3
	// verifySequences of each batch (and as many of the control) are read
	// where the assignment test runs: the score's compute is four forward
	// passes of this many sequences per sampled result, and one more for
	// the loss report. Above assignmentBatchMax, the work test reads
	// workSequences of the batch (two forward passes: an honest result
	// lowers the loss of each of its sequences) and the report check a
	// few more (reportSequences: a report is exact, but a guess can be
	// near one sequence's loss by chance), and that is where
	// verification's compute counts (a large batch is what a GPU trains).
	verifySequences = 2
	workSequences   = 1
	// The report check reads one sequence in reportShare of a batch
	// above assignmentBatchMax, at most reportMax (reportSequences).
	reportShare = 12
	reportMax   = 4
	// assignmentBatchMax is the largest batch (sequences a trainer a round)
	// on which the assignment test is measured. Above it the control batch
	// is not read, which halves verification's compute: trained on that
	// many sequences, a result's effect on two of them is buried (see
	// above), and the rule would stay silent anyway.
	assignmentBatchMax = 4
	// A trainer's last reportWindow loss reports are kept; reportFailing
	// failed ones fail it. A report is exact but for rounding, so one
	// miss could be chance (a sequence whose loss the trainer's backend
	// rounds across the tolerance); two are not.
	reportWindow  = 4
	reportFailing = 2
)

// VerifyWork asks the driver to score one sampled result. Answer with
// verified.
type VerifyWork struct {
	Step    uint32
	Trainer coordinator.ClientID
	Batch   p2p.BatchRange // sequences of its assigned batch
	Control p2p.BatchRange // as many of another trainer's batch of the round; empty: no assignment test
	Frame   *distro.Frame
	LR      float32
}

// verificationSample returns, for round r, the sampled batches (by start)
// and the sequences each is scored on: verification_percent of the
// trainers that have data (rounded up), in an order the round's seed
// shuffles, each controlled by the next one in that order; the scored
// sequences of both batches (as many of each, at most verifySequences) sit
// where the seed puts them, so that a trainer cannot know which of its
// sequences to train alone. Nil when nothing is sampled (0 percent, or one
// trainer: no control).
func verificationSample(s *coordinator.Coordinator, r *coordinator.Round) map[uint64]scored {
	pct := int(s.Config.VerificationPercent)
	if pct == 0 {
		return nil
	}
	type slot struct {
		d   coordinator.DataRange
		key uint64
	}
	var slots []slot
	for k, d := range s.RoundAssignment(r) {
		if d.Count > 0 {
			slots = append(slots, slot{d, mix64(r.RandomSeed ^ mix64(uint64(k)+0x76657269))})
		}
	}
	if len(slots) < 2 {
		return nil
	}
	sort.Slice(slots, func(a, b int) bool { return slots[a].key < slots[b].key })
	want := min(len(slots), (pct*len(slots)+99)/100)
	out := make(map[uint64]scored, want)
	pick := func(d coordinator.DataRange, n uint64) p2p.BatchRange {
		at := d.Start + mix64(r.RandomSeed^mix64(d.Start))%(d.Count-n+1)
		return p2p.BatchRange{Start: at, End: at + n}
	}
	for i := range want {
		own, ctl := slots[i].d, slots[(i+1)%len(slots)].d
		n := min(own.Count, ctl.Count, verifySequences)
		sc := scored{own: pick(own, n), control: pick(ctl, n)}
		sc.report = []p2p.BatchRange{sc.own}
		if own.Count > assignmentBatchMax {
			// The report is read on more sequences than the work test,
			// which needs one, spread over the batch: neighbouring
			// sequences of a text have alike losses, so a guess that
			// matches one is likelier to match the next.
			n := reportSequences(own.Count)
			at := mix64(r.RandomSeed^mix64(own.Start)) % own.Count
			sc = scored{}
			for k := range n {
				i := own.Start + (at+k*(own.Count/n))%own.Count
				sc.report = append(sc.report, p2p.BatchRange{Start: i, End: i + 1})
			}
			sc.own = sc.report[0]
		}
		out[own.Start] = sc
	}
	return out
}

// scored is what a sampled result is scored on: sequences of its batch
// (own), as many of the control batch (none above assignmentBatchMax), and
// the sequences whose reported losses are checked (report: own, or above
// assignmentBatchMax single sequences spread over the batch, own first).
type scored struct {
	own, control p2p.BatchRange
	report       []p2p.BatchRange
}

// reportSequences is how many sequences of a batch of count (above
// assignmentBatchMax) the loss report check reads: one in reportShare,
// at least workSequences and at most reportMax. A report guessed rather
// than computed (the batch's mean loss for every sequence) passed the
// check of one sequence 11 times in 23 on localnet's 24-sequence batches,
// so a lazy trainer sampled one round in four stayed 12 steps on average
// over 6 seeds, once a whole epoch. Three neighbouring sequences passed 4
// times in 17 (neighbours have alike losses, and early on every sequence's
// loss is the untrained model's), and each sequence read costs a witness
// about 2.5% of its compute at 24 sequences (one sequence's forward pass
// does not batch); two sequences far apart in the batch caught it at step
// 6–15 (9.4 on average) for 7.4–8.8% of compute in all, where three
// neighbours took 9.6–11.6%.
// The witness's forward pass of them costs at most 1/reportShare of one
// of the batch, about 1/36 of training it (a forward and a backward pass,
// some three forwards).
func reportSequences(count uint64) uint64 {
	return min(reportMax, max(workSequences, count/reportShare))
}

// mix64 is SplitMix64's finalizer: a fixed bijection that spreads the bits
// of x (so sampling is no simple function of client order).
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// scoreBook is a trainer's last scores and own-batch loss drops, and
// whether its last reported losses failed their check.
type scoreBook struct {
	scores, drops []float32
	reports       []bool // true: failed
	lastReport    string // why the last failed report failed
	flagged       bool   // logged as failing
}

// reportFailures counts b's failed loss reports.
func (b *scoreBook) reportFailures() int {
	if b == nil {
		return 0
	}
	n := 0
	for _, failed := range b.reports {
		if failed {
			n++
		}
	}
	return n
}

// window is a full window's mean and its values at or below 0.
type window struct {
	mean float64
	low  int
}

// windows returns b's full windows: the relative scores' (ok when it holds
// assignmentWindow of them) and the own-batch drops' (scoreWindow).
func (b *scoreBook) windows() (score window, scoreOK bool, drop window, dropOK bool) {
	if b == nil {
		return
	}
	sum := func(v []float32) (w window) {
		for _, s := range v {
			w.mean += float64(s)
			if s <= 0 {
				w.low++
			}
		}
		w.mean /= float64(len(v))
		return w
	}
	if len(b.scores) == assignmentWindow {
		score, scoreOK = sum(b.scores), true
	}
	if len(b.drops) == scoreWindow {
		drop, dropOK = sum(b.drops), true
	}
	return
}

// verifying reports whether this node scores the current round's sampled
// results: verification is on, the round trains, and this node is one of
// its witnesses.
func (m *Machine) verifying() bool {
	s := m.snap
	if s.Config.VerificationPercent == 0 || (s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness) {
		return false
	}
	i, ok := m.member()
	return ok && s.Config.WitnessProofFor(s.CurrentRound(), i).IsWitness
}

// referenceSequences are the scored sequences of the current round's
// sampled batches, when this node verifies the round.
func (m *Machine) referenceSequences() []p2p.BatchRange {
	if !m.verifying() {
		return nil
	}
	var out []p2p.BatchRange
	for _, sc := range verificationSample(m.snap, m.snap.CurrentRound()) {
		out = append(out, sc.report...)
	}
	slices.SortFunc(out, func(a, b p2p.BatchRange) int { return cmp.Compare(a.Start, b.Start) })
	return out
}

// verifyWork adds the scoring of a stored result to rd when this node is a
// witness of the result's round and the round's sample holds its batch,
// and checks the losses the result reports against this node's (now, or
// once this node has measured them).
func (m *Machine) verifyWork(a p2p.Announcement, f *distro.Frame, rd *Ready) {
	s := m.snap
	if a.Step != s.Progress.Step || !m.verifying() {
		return
	}
	sc, sampled := verificationSample(s, s.CurrentRound())[a.Batch.Start]
	if !sampled || sc.own.End > a.Batch.End {
		return
	}
	rd.Verify = append(rd.Verify, VerifyWork{Step: a.Step, Trainer: a.Trainer, Frame: f, LR: schedule.LR(s.Model.LR, a.Step),
		Batch: sc.own, Control: sc.control})
	r := lossReport{trainer: a.Trainer, step: a.Step, commitment: a.Commitment, batch: a.Batch, scored: sc.report, losses: f.Losses}
	if rs := m.round(a.Step); rs.reference == nil {
		rs.pending = append(rs.pending, r)
	} else {
		m.checkReport(r, rs.reference, rd)
	}
}

// lossReport is what a sampled result says it saw: its sequence losses
// (the frame's), of which those of the scored sequences are checked.
type lossReport struct {
	trainer    coordinator.ClientID
	step       uint32
	commitment coordinator.Hash
	batch      p2p.BatchRange // its assignment
	scored     []p2p.BatchRange
	losses     []float32
}

// ReferenceLosses takes this node's losses of step's scored sequences on
// the model the round trained on (TrainWork.Reference) and checks the
// reports that came before them.
func (m *Machine) ReferenceLosses(step uint32, ref map[uint64]float32) Ready {
	var rd Ready
	rs := m.round(step)
	rs.reference = ref
	for _, r := range rs.pending {
		m.checkReport(r, ref, &rd)
	}
	rs.pending = nil
	return rd
}

// reportTolerance is how far a reported sequence loss may be from this
// node's: 0.02 plus 0.5%. The same model on the same data gives the same
// loss to float rounding, whatever the engine: measured (the torch engine's
// TestLossReportGap), the Go and PyTorch engines in fp32 lie ≤ 5e-7 apart
// per sequence, and torch's bf16 autocast ≤ 2e-4 from fp32 on the CPU
// (bf16 products on a GPU move it by up to ~1e-2), while the losses of two sequences of a text
// differ by tenths: a trainer that did not run its own sequences matches
// both scored ones by chance rarely (about 1 time in 100 on localnet's
// text).
func reportTolerance(ref float32) float64 { return 0.02 + 0.005*math.Abs(float64(ref)) }

// checkReport records whether r's losses of its scored sequences are this
// node's (ref, by data index).
func (m *Machine) checkReport(r lossReport, ref map[uint64]float32, rd *Ready) {
	ok, why := true, ""
	if count := r.batch.End - r.batch.Start; uint64(len(r.losses)) != count {
		ok, why = false, fmt.Sprintf("it reported %d sequence losses for a batch of %d", len(r.losses), count)
	}
	for _, sc := range r.scored {
		for idx := sc.Start; ok && idx < sc.End; idx++ {
			want, measured := ref[idx]
			if !measured {
				return // not this node's sample (another view of the round): no verdict
			}
			if idx < r.batch.Start || idx >= r.batch.End {
				ok, why = false, fmt.Sprintf("sequence %d is outside its batch", idx)
				break
			}
			if got := r.losses[idx-r.batch.Start]; math.Abs(float64(got-want)) > reportTolerance(want) {
				ok, why = false, fmt.Sprintf("it reported a loss of %.4f on sequence %d, where the round's model gives %.4f", got, idx, want)
			}
		}
	}
	rd.Reports = append(rd.Reports, ReportChecked{Trainer: r.trainer, Step: r.step, Why: why})
	b := m.bookOf(r.trainer.Signer)
	b.reports = append(b.reports, !ok)
	b.reports = b.reports[max(0, len(b.reports)-reportWindow):]
	if !ok {
		b.lastReport = why
		// This result is not what it claims to be: not vouched for, even
		// before its trainer has failed often enough to be left out.
		if res := m.results[r.step][r.batch.Start]; res != nil && res.ann.Commitment == r.commitment {
			res.misreported = true
		}
	}
	m.judge(r.trainer, rd)
}

// Verified takes a score (when scored: the control was read) and the loss
// drop on the trainer's own batch (NaN: it could not be computed, e.g. a
// loss that was not finite, which counts as the lowest value).
func (m *Machine) Verified(id coordinator.ClientID, score, drop float32, scored bool) Ready {
	b := m.bookOf(id.Signer)
	if score != score {
		score = -1
	}
	if drop != drop {
		drop = -1
	}
	keep := func(v []float32, x float32, n int) []float32 {
		v = append(v, x)
		return v[max(0, len(v)-n):]
	}
	if scored {
		b.scores = keep(b.scores, score, assignmentWindow)
	}
	b.drops = keep(b.drops, drop, scoreWindow)
	var rd Ready
	m.judge(id, &rd)
	return rd
}

// bookOf returns trainer's scoreBook, made on first use.
func (m *Machine) bookOf(trainer coordinator.Pubkey) *scoreBook {
	if m.scores == nil {
		m.scores = map[coordinator.Pubkey]*scoreBook{}
	}
	b := m.scores[trainer]
	if b == nil {
		b = &scoreBook{}
		m.scores[trainer] = b
	}
	return b
}

// judge refuses id's results (once, when it starts failing) in rd.
func (m *Machine) judge(id coordinator.ClientID, rd *Ready) {
	b := m.bookOf(id.Signer)
	if m.failing(id.Signer) && !b.flagged {
		b.flagged = true
		why := fmt.Sprintf("of its last %d verified results, %d or more did not lower its own batch's loss, or of its last %d, %d or more did not lower it more than another batch's, while its peers' did: no work on its assigned data", scoreWindow, workFailing, assignmentWindow, assignmentFailing)
		if m.reportsFail(id.Signer) {
			why = fmt.Sprintf("%d of its last %d reports of its batch's losses were not what the round's model gives (%s): not trained on its assignment, or not on the round's model", b.reportFailures(), len(b.reports), b.lastReport)
		}
		rd.Refused = append(rd.Refused, RefusedResult{Trainer: id, Step: m.snap.Progress.Step, Why: why})
	} else if !m.failing(id.Signer) {
		b.flagged = false
	}
}

// reportsFail reports whether reportFailing of trainer's last reportWindow
// loss reports failed, while the median trainer this node checked has none
// failed (at least three such trainers): a node whose own model went astray
// fails everyone's reports, and then accuses no one.
func (m *Machine) reportsFail(trainer coordinator.Pubkey) bool {
	if m.scores[trainer].reportFailures() < reportFailing {
		return false
	}
	var fails []float64
	for _, b := range m.scores {
		if len(b.reports) >= 1 {
			fails = append(fails, float64(b.reportFailures()))
		}
	}
	return len(fails) >= 3 && median(fails) == 0
}

// failing reports whether this node's witness reports leave trainer out
// (the rule above).
func (m *Machine) failing(trainer coordinator.Pubkey) bool {
	score, scoreOK, drop, dropOK := m.scores[trainer].windows()
	work := dropOK && drop.low >= workFailing
	ownData := scoreOK && score.low >= assignmentFailing
	if !work && !ownData {
		return m.reportsFail(trainer)
	}
	var means, lows, dropLows []float64
	for _, b := range m.scores {
		s, sOK, d, dOK := b.windows()
		if sOK {
			means, lows = append(means, s.mean), append(lows, float64(s.low))
		}
		if dOK {
			dropLows = append(dropLows, float64(d.low))
		}
	}
	work = work && len(dropLows) >= 3 && median(dropLows) <= scoreClear
	ownData = ownData && len(means) >= 3 && median(lows) <= assignmentClear && score.mean < median(means)/2
	return work || ownData || m.reportsFail(trainer)
}

func median(v []float64) float64 {
	sort.Float64s(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}
