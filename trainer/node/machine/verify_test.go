package machine

import (
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// TestVerificationSample: the sample is verification_percent of the
// round's trainers with data, rounded up, the same for every reader of the
// round, different from round to round, each sampled batch controlled by
// another trainer's batch of as many sequences (at most verifySequences),
// or, where batches hold more than assignmentBatchMax sequences, by none.
func TestVerificationSample(t *testing.T) {
	round := func(s *coordinator.Coordinator, seed uint64) *coordinator.Round {
		r := s.CurrentRound()
		r.RandomSeed, r.ClientsLen, r.DataIndex = seed, 10, 0
		return r
	}
	for _, tc := range []struct {
		pct, clients, batch int
		want                int
	}{
		{0, 10, 40, 0}, {1, 10, 40, 1}, {10, 10, 40, 1}, {11, 10, 40, 2}, {50, 10, 40, 5}, {100, 10, 40, 10},
		{100, 1, 40, 0},  // one trainer: nothing to control with
		{100, 10, 4, 4},  // four trainers have data
		{50, 10, 200, 5}, // 20 sequences a trainer: no control, the report read on 1
		{50, 4, 96, 2},   // 24: the report read on 2
		{25, 4, 800, 1},  // 200: the report read on reportMax
	} {
		s := &coordinator.Coordinator{}
		s.Config.VerificationPercent = uint8(tc.pct)
		s.Config.GlobalBatchSizeStart, s.Config.GlobalBatchSizeEnd = uint16(tc.batch), uint16(tc.batch)
		r := round(s, 7)
		r.ClientsLen = uint16(tc.clients)
		got := verificationSample(s, r)
		if len(got) != tc.want {
			t.Fatalf("%d%% of %d clients, batch %d: %d sampled, want %d", tc.pct, tc.clients, tc.batch, len(got), tc.want)
		}
		assigned := map[uint64]coordinator.DataRange{}
		for _, d := range s.RoundAssignment(r) {
			if d.Count > 0 {
				assigned[d.Start] = d
			}
		}
		inside := func(b p2p.BatchRange) (coordinator.DataRange, bool) {
			for _, d := range assigned {
				if b.Start >= d.Start && b.End <= d.Start+d.Count && b.End > b.Start {
					return d, true
				}
			}
			return coordinator.DataRange{}, false
		}
		for own, sc := range got {
			d, ok := assigned[own]
			if !ok {
				t.Fatalf("sampled batch %d is no trainer's", own)
			}
			if o, ok := inside(sc.own); !ok || o != d {
				t.Fatalf("batch %d is scored on %+v, outside it", own, sc.own)
			}
			if d.Count > assignmentBatchMax {
				if sc.control != (p2p.BatchRange{}) || sc.own.End-sc.own.Start != min(d.Count, workSequences) {
					t.Fatalf("batch %d (%+v, above %d sequences): own %+v, control %+v", own, d, assignmentBatchMax, sc.own, sc.control)
				}
				want := min(reportMax, max(workSequences, d.Count/reportShare))
				if uint64(len(sc.report)) != want || sc.report[0] != sc.own {
					t.Fatalf("batch %d (%+v): report read on %+v, want %d sequences, own %+v first", own, d, sc.report, want, sc.own)
				}
				seen := map[uint64]bool{}
				for _, r := range sc.report {
					if b, ok := inside(r); !ok || b != d || r.End != r.Start+1 || seen[r.Start] {
						t.Fatalf("batch %d (%+v): report read on %+v: not distinct single sequences of the batch", own, d, sc.report)
					}
					seen[r.Start] = true
				}
				continue
			}
			if len(sc.report) != 1 || sc.report[0] != sc.own {
				t.Fatalf("batch %d (%+v): report read on %+v, not on own %+v", own, d, sc.report, sc.own)
			}
			c, ok := inside(sc.control)
			n := min(d.Count, c.Count, verifySequences)
			if !ok || c == d || sc.own.End-sc.own.Start != n || sc.control.End-sc.control.Start != n {
				t.Fatalf("batch %d (%+v): own %+v, control %+v", own, d, sc.own, sc.control)
			}
		}
		if again := verificationSample(s, r); len(again) != len(got) {
			t.Fatal("the sample is not a function of the round")
		}
	}
	s := &coordinator.Coordinator{}
	s.Config.VerificationPercent, s.Config.GlobalBatchSizeStart, s.Config.GlobalBatchSizeEnd = 10, 100, 100
	seen := map[uint64]bool{}
	for seed := range uint64(40) {
		for own := range verificationSample(s, round(s, seed)) {
			seen[own] = true
		}
	}
	if len(seen) < 8 {
		t.Fatalf("40 rounds sampled only %d of 10 trainers", len(seen))
	}
}

// TestScoreWindow: a trainer fails once a full window holds
// assignmentFailing scores at or below 0 (NaN counts as −1) with a mean
// under half its peers' median, while that median shows honest work, or
// workFailing own-batch loss drops at or below 0 while its peers' drops are
// positive; it recovers
// when the low values leave the window. Where the peers' scores are as weak
// as its own, or too few peers have full windows, nobody fails.
func TestScoreWindow(t *testing.T) {
	newM := func() *Machine {
		m := New(coordinator.ClientID{}, 0, false, func() uint64 { return 0 })
		m.snap = &coordinator.Coordinator{}
		return m
	}
	peers := func(m *Machine, n int, score float32) {
		for p := range n {
			for range assignmentWindow {
				m.Verified(coordinator.ClientID{Signer: coordinator.Pubkey{byte(10 + p)}}, score, 0.05, true)
			}
		}
	}
	id := coordinator.ClientID{Signer: coordinator.Pubkey{1}}
	nan := float32(0)
	nan /= nan
	// lazyOf's first failing values of a window are at or below 0.
	lazyOf := func(failing int) func(int) float32 {
		return func(i int) float32 {
			switch {
			case i == 1:
				return nan
			case i < failing:
				return 0
			}
			return 0.2
		}
	}
	lazy, idle := lazyOf(assignmentFailing), lazyOf(workFailing)

	m := newM()
	peers(m, 3, 0.3)
	for i := range assignmentWindow {
		rd := m.Verified(id, lazy(i), 0.05, true)
		last := i == assignmentWindow-1
		if m.failing(id.Signer) != last || (len(rd.Refused) == 1) != last {
			t.Fatalf("after %d scores: failing %v, refused %v", i+1, m.failing(id.Signer), rd.Refused)
		}
	}
	if rd := m.Verified(id, 0.5, 0.05, true); m.failing(id.Signer) || len(rd.Refused) != 0 {
		t.Fatal("a positive score that pushes a low one out of the window did not clear it")
	}
	for p := range 3 {
		if m.failing(coordinator.Pubkey{byte(10 + p)}) {
			t.Fatalf("honest peer %d fails", p)
		}
	}
	if m.failing(coordinator.Pubkey{2}) {
		t.Fatal("a trainer never scored is failing")
	}

	for _, tc := range []struct {
		name  string
		peers int
		score float32
	}{{"weak honest work (large batches): peers as often low", 3, -0.01}, {"one peer only", 1, 0.3}} {
		m := newM()
		peers(m, tc.peers, tc.score)
		for i := range assignmentWindow {
			m.Verified(id, lazy(i), 0.05, true)
		}
		if m.failing(id.Signer) {
			t.Fatalf("%s: the trainer fails", tc.name)
		}
	}

	// The work test: results that do not lower their own batch's loss half
	// the time fail, whatever the relative scores say, while the peers'
	// results lower theirs; NaN counts as no drop.
	m = newM()
	peers(m, 3, -0.01) // large batches: relative scores tell nothing
	for i := range scoreWindow {
		m.Verified(id, 0.3, idle(i), true)
	}
	if !m.failing(id.Signer) {
		t.Fatal("a trainer whose results do not lower its own batch's loss half the time does not fail")
	}

	// Large batches: no control is read, so there are no relative scores
	// (an empty window), and the work test alone decides.
	m = newM()
	for p := range 3 {
		for range scoreWindow {
			m.Verified(coordinator.ClientID{Signer: coordinator.Pubkey{byte(10 + p)}}, 0, 0.05, false)
		}
	}
	for range scoreWindow {
		if m.Verified(id, 0, 0.05, false); m.failing(id.Signer) {
			t.Fatal("a trainer whose results lower its batch's loss fails without relative scores")
		}
	}
	for i := range scoreWindow {
		m.Verified(id, 0, idle(i), false)
	}
	if !m.failing(id.Signer) || len(m.scores[id.Signer].scores) != 0 {
		t.Fatalf("without relative scores, a trainer of no work: failing %v, scores kept %v", m.failing(id.Signer), m.scores[id.Signer].scores)
	}
}

// TestLossReports: a sampled result's reported losses of its scored
// sequences must be this node's on the round's model (within
// reportTolerance); a trainer fails once reportFailing of its last
// reportWindow reports did not match, or did not report its batch's count,
// while its peers' did; a node whose measurements match nobody accuses
// nobody. Reports that came before the node's measurements are checked
// when they come.
func TestLossReports(t *testing.T) {
	m := New(coordinator.ClientID{}, 0, false, func() uint64 { return 0 })
	m.snap = &coordinator.Coordinator{}
	batch := func(p int) p2p.BatchRange { return p2p.BatchRange{Start: uint64(10 * p), End: uint64(10*p + 4)} }
	ref := map[uint64]float32{}
	for p := range 4 {
		for i := range uint64(4) {
			ref[batch(p).Start+i] = 3 + float32(i)/10
		}
	}
	honest := func(p int) []float32 {
		out := make([]float32, 4)
		for i := range out {
			out[i] = ref[batch(p).Start+uint64(i)] + 0.01 // rounding of another backend
		}
		return out
	}
	id := func(p int) coordinator.ClientID { return coordinator.ClientID{Signer: coordinator.Pubkey{byte(p + 1)}} }
	report := func(p int, losses []float32) lossReport {
		b := batch(p)
		return lossReport{trainer: id(p), step: 5, commitment: coordinator.Hash{byte(p + 1)}, batch: b,
			scored: []p2p.BatchRange{{Start: b.Start + 1, End: b.Start + 2}}, losses: losses}
	}
	for p := range 4 { // the results of step 5 this node holds
		m.store(p2p.Announcement{Step: 5, Batch: batch(p), Trainer: id(p), Commitment: coordinator.Hash{byte(p + 1)}}, nil)
	}
	for step := range uint32(2) {
		var rd Ready
		for p := range 3 {
			m.checkReport(report(p, honest(p)), ref, &rd)
		}
		if len(rd.Refused) != 0 {
			t.Fatalf("step %d: honest reports refused: %v", step, rd.Refused)
		}
	}
	wrong := honest(3)
	wrong[1] += 0.3 // another sequence's loss
	var rd Ready
	m.checkReport(report(3, wrong), ref, &rd)
	if m.failing(id(3).Signer) || len(rd.Refused) != 0 {
		t.Fatal("one failed report failed the trainer")
	}
	for p := range 4 {
		if got := m.results[5][batch(p).Start].misreported; got != (p == 3) {
			t.Fatalf("trainer %d's result: misreported %v", p, got)
		}
	}
	// The second failure comes before this node has measured the round:
	// pending until referenceLosses.
	m.round(7).pending = append(m.round(7).pending, report(3, honest(3)[:3]))
	if m.failing(id(3).Signer) {
		t.Fatal("a pending report was judged")
	}
	rd = m.ReferenceLosses(7, ref)
	if !m.failing(id(3).Signer) || len(rd.Refused) != 1 || !strings.Contains(rd.Refused[0].Why, "reported 3 sequence losses for a batch of 4") {
		t.Fatalf("two failed reports of four: failing %v, refused %v", m.failing(id(3).Signer), rd.Refused)
	}
	for p := range 3 {
		if m.failing(id(p).Signer) {
			t.Fatalf("honest trainer %d fails", p)
		}
	}

	// A node whose own measurements are off fails everyone's reports, and
	// so accuses no one.
	m = New(coordinator.ClientID{}, 0, false, func() uint64 { return 0 })
	m.snap = &coordinator.Coordinator{}
	off := map[uint64]float32{}
	for k, v := range ref {
		off[k] = v + 1
	}
	for range 2 {
		for p := range 4 {
			var rd Ready
			m.checkReport(report(p, honest(p)), off, &rd)
			if len(rd.Refused) != 0 || m.failing(id(p).Signer) {
				t.Fatalf("trainer %d accused by a node whose model went astray", p)
			}
		}
	}
}
