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
// than another's: honest trainers score above 0 about 92–100% of the time
// (measured on the test model: means 0.15–0.2; on a 2-layer, 64-wide model:
// 0.6), while a result of no work (noise, a lazy guess, zeros) or one
// trained on other data than its assignment scores about 0, at or below 0
// 58–88% of the time. The rule is a sign test, free of the model's scale: a
// trainer with at least scoreFailing of its last scoreWindow scores at or
// below 0 (a full window) is left out of the witness's participant and
// broadcast blooms: its results are not applied, and the next round's
// health check drops it like a trainer that sent nothing. For an honest
// trainer (p ≈ 0.08 per score) a window of 16 with 8 failures has
// probability about 1e-5; a lazy one (p ≈ 0.65) fails most windows. Which trainers are sampled, and the control batch of each, come
// from the round's seed, so every witness scores the same results on the
// same data; witnesses may hold the model a round apart, which moves a score
// by far less than the margin between the two kinds.
const (
	scoreWindow  = 16
	scoreFailing = 8
	// verifySequences of each batch are read: the score's compute is six
	// forward passes of this many sequences per sampled result.
	verifySequences = 4
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
// and each one's control range: verification_percent of the trainers that
// have data (rounded up), in an order the round's seed shuffles, each
// controlled by the next one in that order. Nil when nothing is sampled (0
// percent, or one trainer: no control).
func verificationSample(s *coordinator.Coordinator, r *coordinator.Round) map[uint64]p2p.BatchRange {
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
	out := make(map[uint64]p2p.BatchRange, want)
	for i := range want {
		own, ctl := slots[i].d, slots[(i+1)%len(slots)].d
		n := min(own.Count, ctl.Count, verifySequences)
		out[own.Start] = p2p.BatchRange{Start: ctl.Start, End: ctl.Start + n}
	}
	return out
}

// mix64 is SplitMix64's finalizer: a fixed bijection that spreads the bits
// of x (so sampling is no simple function of client order).
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// scoreBook is a trainer's last scores.
type scoreBook struct {
	scores  []float32
	flagged bool // logged as failing
}

func (b *scoreBook) failing() bool {
	if b == nil || len(b.scores) < scoreWindow {
		return false
	}
	low := 0
	for _, s := range b.scores {
		if s <= 0 {
			low++
		}
	}
	return low >= scoreFailing
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
	ctl, sampled := verificationSample(s, s.CurrentRound())[a.Batch.Start]
	if !sampled {
		return
	}
	n := min(a.Batch.End-a.Batch.Start, ctl.End-ctl.Start)
	rd.Verify = append(rd.Verify, VerifyWork{Step: a.Step, Trainer: a.Trainer, Frame: f, LR: schedule.LR(s.Model.LR, a.Step),
		Batch: p2p.BatchRange{Start: a.Batch.Start, End: a.Batch.Start + n}, Control: p2p.BatchRange{Start: ctl.Start, End: ctl.Start + n}})
}

// verified takes a score (NaN: it could not be computed, e.g. a loss that
// was not finite, which counts as the lowest score).
func (m *machine) verified(id coordinator.ClientID, score float32) Ready {
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
	b.scores = append(b.scores, score)
	if len(b.scores) > scoreWindow {
		b.scores = b.scores[len(b.scores)-scoreWindow:]
	}
	var rd Ready
	if b.failing() && !b.flagged {
		b.flagged = true
		rd.Refused = append(rd.Refused, RefusedResult{Trainer: id, Step: m.snap.Progress.Step,
			Why: fmt.Sprintf("%d or more of its last %d verification scores are at or below 0: no work on its assigned data", scoreFailing, scoreWindow)})
	} else if !b.failing() {
		b.flagged = false
	}
	return rd
}

// failing reports whether this node's witness reports leave trainer out.
func (m *machine) failing(trainer coordinator.Pubkey) bool { return m.scores[trainer].failing() }

// verify computes a VerifyWork's score on the model as it is, and leaves
// the model exactly as it found it.
func (n *Node) verify(ctx context.Context, w VerifyWork) (float32, error) {
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
		return 0, err
	}
	cin, ctg, ccount, err := read(w.Control)
	if err != nil {
		return 0, err
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
		return 0, err
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
	if err := n.opt.Apply(params, []*distro.Frame{w.Frame}, w.LR); err != nil {
		return float32(math.NaN()), nil // a frame the run's optimizer refuses did no work
	}
	after0, afterC, err := losses()
	if err != nil {
		return 0, err
	}
	own, ctl := before0-after0, beforeC-afterC
	score := (own - ctl) / (math.Abs(own) + math.Abs(ctl) + 1e-12)
	if math.IsNaN(score) || math.IsInf(own+ctl, 0) {
		return float32(math.NaN()), nil
	}
	n.cfg.log.Debug("verified", "trainer", w.Trainer.Signer.String(), "step", w.Step, "score", score, "own_drop", own, "control_drop", ctl)
	return float32(score), nil
}
