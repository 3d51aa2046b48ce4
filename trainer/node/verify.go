package node

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/schedule"
)

// Verified work. A run's verification_percent is the share of each round's
// trainers whose results the round's witnesses score, in the spirit of
// Templar's Gauntlet: the witness measures the loss on a few sequences of
// the trainer's assigned batch before and after applying that result alone,
// and the same on a control batch (another trainer's of the round), and
// scores
//
//	(drop on its own batch − drop on the control) / (|drop on its own| + |drop on the control|)
//
// in [−1, 1]. A result trained on its batch lowers that batch's loss more
// than another's, by how much depends on how few sequences the batch holds:
// trained on 3 sequences (the node tests' runs), honest trainers score above
// 0 92–100% of the time (means 0.15–0.2), while a result of no work (noise,
// a lazy guess, zeros) or one trained on other data than its assignment
// scores about 0, at or below 0 58–88% of the time; trained on 24 (localnet)
// and read on 2 of them, honest means fall to about 0.06 and honest scores
// are at or below 0 20–50% of the time: no rule can tell honest from lazy
// there from a window of scores.
//
// The loss drop on its own batch alone tells more at any batch size: an
// honest result lowers it (on localnet's batches: 0 to 1 times in 60–80 it
// did not), noise raises it (39 times in 63 it did not lower it), and zeros
// leave it. So a witness keeps both, and applies two tests.
//
// Work: a trainer fails when at least workFailing of its last scoreWindow
// drops are at or below 0, while the median trainer has at most scoreClear.
// Noise lowers the loss about half the time (a random step's first-order
// effect is as often up as down), so a window of 8 holds 4 or more failures
// with probability 0.64; an honest trainer whose drops fail 1 time in 60
// holds 4 with probability about 4e-6.
//
// Its own data: the rule judges a trainer against its peers, and only while the peers'
// work is visible: a trainer fails when its last scoreWindow scores (a full
// window) hold at least scoreFailing at or below 0 and their mean is under
// half the median of the means of every trainer this node has a full window
// of, while the median trainer has at most scoreClear of its window at or
// below 0 (with at least three such trainers, itself included, so that a
// minority of lazy ones cannot set the medians). On localnet's batches the
// median trainer has 2 to 4 low scores in 8, so the rule stays silent. A failing trainer
// is left out of the witness's participant and broadcast blooms: its results
// are not applied, and the next round's health check drops it like a
// trainer that sent nothing. Where honest work is not visible (large
// batches) nobody fails: the check then catches nothing, and drops no one. Which trainers are sampled, and the control batch of each, come
// from the round's seed, so every witness scores the same results on the
// same data; witnesses may hold the model a round apart, which moves a score
// by far less than the margin between the two kinds.
const (
	scoreWindow  = 8
	scoreFailing = 5
	workFailing  = 4
	scoreClear   = 2
	// verifySequences of each batch are read: the score's compute is six
	// forward passes of this many sequences per sampled result.
	verifySequences = 2
)

// VerifyWork asks the driver to score one sampled result. Answer with
// verified.
type VerifyWork struct {
	Step    uint32
	Trainer coordinator.ClientID
	Batch   p2p.BatchRange // sequences of its assigned batch
	Control p2p.BatchRange // as many of another trainer's batch of the round
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
		out[own.Start] = scored{own: pick(own, n), control: pick(ctl, n)}
	}
	return out
}

// scored is what a sampled result is scored on: sequences of its batch, and
// as many of the control batch.
type scored struct{ own, control p2p.BatchRange }

// mix64 is SplitMix64's finalizer: a fixed bijection that spreads the bits
// of x (so sampling is no simple function of client order).
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// scoreBook is a trainer's last scores and own-batch loss drops.
type scoreBook struct {
	scores, drops []float32
	flagged       bool // logged as failing
}

// window is a full window's mean and its values at or below 0.
type window struct {
	mean float64
	low  int
}

// full reports whether b holds full windows, and their figures.
func (b *scoreBook) full() (score, drop window, ok bool) {
	if b == nil || len(b.scores) < scoreWindow {
		return window{}, window{}, false
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
	return sum(b.scores), sum(b.drops), true
}

// verifyWork adds the scoring of a stored result to rd when this node is a
// witness of the result's round and the round's sample holds its batch.
func (m *machine) verifyWork(a p2p.Announcement, f *distro.Frame, rd *Ready) {
	s := m.snap
	if s.Config.VerificationPercent == 0 || a.Step != s.Progress.Step ||
		(s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness) {
		return
	}
	i, ok := m.member()
	if !ok || !s.Config.WitnessProofFor(s.CurrentRound(), i).IsWitness {
		return
	}
	sc, sampled := verificationSample(s, s.CurrentRound())[a.Batch.Start]
	if !sampled || sc.own.End > a.Batch.End {
		return
	}
	rd.Verify = append(rd.Verify, VerifyWork{Step: a.Step, Trainer: a.Trainer, Frame: f, LR: schedule.LR(s.Model.LR, a.Step),
		Batch: sc.own, Control: sc.control})
}

// verified takes a score and the loss drop on the trainer's own batch (NaN:
// it could not be computed, e.g. a loss that was not finite, which counts as
// the lowest value).
func (m *machine) verified(id coordinator.ClientID, score, drop float32) Ready {
	trainer := id.Signer
	if m.scores == nil {
		m.scores = map[coordinator.Pubkey]*scoreBook{}
	}
	b := m.scores[trainer]
	if b == nil {
		b = &scoreBook{}
		m.scores[trainer] = b
	}
	if score != score {
		score = -1
	}
	if drop != drop {
		drop = -1
	}
	b.scores, b.drops = append(b.scores, score), append(b.drops, drop)
	if len(b.scores) > scoreWindow {
		b.scores, b.drops = b.scores[len(b.scores)-scoreWindow:], b.drops[len(b.drops)-scoreWindow:]
	}
	var rd Ready
	if m.failing(trainer) && !b.flagged {
		b.flagged = true
		rd.Refused = append(rd.Refused, RefusedResult{Trainer: id, Step: m.snap.Progress.Step,
			Why: fmt.Sprintf("of its last %d verified results, %d or more did not lower its own batch's loss, or %d or more did not lower it more than another batch's, while its peers' did: no work on its assigned data", scoreWindow, workFailing, scoreFailing)})
	} else if !m.failing(trainer) {
		b.flagged = false
	}
	return rd
}

// failing reports whether this node's witness reports leave trainer out
// (the rule above).
func (m *machine) failing(trainer coordinator.Pubkey) bool {
	score, drop, ok := m.scores[trainer].full()
	if !ok || (score.low < scoreFailing && drop.low < workFailing) {
		return false
	}
	var means, lows, dropLows []float64
	for _, b := range m.scores {
		if s, d, ok := b.full(); ok {
			means, lows, dropLows = append(means, s.mean), append(lows, float64(s.low)), append(dropLows, float64(d.low))
		}
	}
	if len(means) < 3 {
		return false
	}
	work := drop.low >= workFailing && median(dropLows) <= scoreClear
	ownData := score.low >= scoreFailing && median(lows) <= scoreClear && score.mean < median(means)/2
	return work || ownData
}

func median(v []float64) float64 {
	sort.Float64s(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}

// verify computes a VerifyWork's score and own-batch loss drop on the model
// as it is, and leaves the model exactly as it found it.
func (n *Node) verify(ctx context.Context, w VerifyWork) (score, drop float32, err error) {
	n.finishAhead() // the model is shared with a gradient trained ahead
	start := time.Now()
	defer func() {
		n.cfg.metrics.ComputeSeconds.Add(time.Since(start).Seconds())
		n.cfg.metrics.VerifySeconds.Add(time.Since(start).Seconds())
		n.cfg.metrics.Verifications.Inc()
	}()
	seqLen := runmodel.ConfigOf(n.model).Context()
	read := func(b p2p.BatchRange) ([]uint32, []uint32, int, error) {
		count := int(b.End - b.Start)
		in, tg := make([]uint32, 0, count*seqLen), make([]uint32, 0, count*seqLen)
		buf := make([]uint32, seqLen+1)
		for idx := b.Start; idx < b.End; idx++ {
			seq, err := n.data.Sequence(ctx, idx, buf)
			if err != nil {
				return nil, nil, 0, fmt.Errorf("node: data index %d: %w", idx, err)
			}
			in = append(in, seq[:seqLen]...)
			tg = append(tg, seq[1:seqLen+1]...)
		}
		return in, tg, count, nil
	}
	oin, otg, ocount, err := read(w.Batch)
	if err != nil {
		return 0, 0, err
	}
	cin, ctg, ccount, err := read(w.Control)
	if err != nil {
		return 0, 0, err
	}
	losses := func() (float64, float64, error) {
		lo, err := n.model.Forward(oin, otg, ocount, seqLen)
		if err != nil {
			return 0, 0, err
		}
		lc, err := n.model.Forward(cin, ctg, ccount, seqLen)
		return float64(lo), float64(lc), err
	}
	before0, beforeC, err := losses()
	if err != nil {
		return 0, 0, err
	}
	params := n.model.Tensors()
	saved := make([][]float32, len(params))
	for i, p := range params {
		saved[i] = append([]float32(nil), p...)
	}
	defer func() {
		for i, p := range params {
			copy(p, saved[i])
		}
	}()
	nan := float32(math.NaN())
	if err := n.opt.Apply(params, []*distro.Frame{w.Frame}, w.LR); err != nil {
		return nan, nan, nil // a frame the run's optimizer refuses did no work
	}
	after0, afterC, err := losses()
	if err != nil {
		return 0, 0, err
	}
	own, ctl := before0-after0, beforeC-afterC
	s := (own - ctl) / (math.Abs(own) + math.Abs(ctl) + 1e-12)
	if math.IsNaN(s) || math.IsInf(own+ctl, 0) {
		return nan, nan, nil
	}
	n.cfg.log.Debug("verified", "trainer", w.Trainer.Signer.String(), "step", w.Step, "score", s, "own_drop", own, "control_drop", ctl)
	return float32(s), float32(own), nil
}
