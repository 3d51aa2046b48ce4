package node

import (
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// TestVerificationSample: the sample is verification_percent of the
// round's trainers with data, rounded up, the same for every reader of the
// round, different from round to round, each sampled batch controlled by
// another trainer's batch of as many sequences (at most verifySequences).
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
		{100, 1, 40, 0}, // one trainer: nothing to control with
		{100, 10, 4, 4}, // four trainers have data
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
		for own, ctl := range got {
			d, ok := assigned[own]
			if !ok {
				t.Fatalf("sampled batch %d is no trainer's", own)
			}
			c, ok := assigned[ctl.Start]
			if !ok || ctl.Start == own || ctl.End-ctl.Start != min(d.Count, c.Count, verifySequences) {
				t.Fatalf("batch %d's control %+v", own, ctl)
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

// TestScoreWindow: a trainer fails once a full window holds scoreFailing
// scores at or below 0 (NaN counts as −1), and recovers when they leave it.
func TestScoreWindow(t *testing.T) {
	m := newMachine(coordinator.ClientID{}, 0, false, func() uint64 { return 0 })
	m.snap = &coordinator.Coordinator{}
	id := coordinator.ClientID{Signer: coordinator.Pubkey{1}}
	nan := float32(0)
	nan /= nan
	for i := range scoreWindow {
		score := float32(0.3)
		if i%2 == 0 {
			score = 0 // half the window at 0: exactly scoreFailing
		}
		if i == 4 {
			score = nan
		}
		rd := m.verified(id, score)
		if m.failing(id.Signer) != (i == scoreWindow-1) {
			t.Fatalf("after %d scores: failing %v", i+1, m.failing(id.Signer))
		}
		if (len(rd.Refused) == 1) != (i == scoreWindow-1) {
			t.Fatalf("after %d scores: refused %v", i+1, rd.Refused)
		}
	}
	if rd := m.verified(id, 0.5); m.failing(id.Signer) || len(rd.Refused) != 0 {
		t.Fatal("a positive score that pushes a failure out of the window did not clear it")
	}
	if m.failing(coordinator.Pubkey{2}) {
		t.Fatal("a trainer never scored is failing")
	}
}
