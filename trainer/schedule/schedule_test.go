package schedule

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

func sched(kind coordinator.LRScheduleKind, base, final float32, warmup, decay, total uint32) coordinator.LRSchedule {
	return coordinator.LRSchedule{Kind: kind, BaseLR: base, FinalLR: final, WarmupSteps: warmup, DecaySteps: decay, TotalSteps: total}
}

// The expected values are chosen to be exactly representable, or are written
// as the float32 rounding of the exact real value, so that == is the right
// comparison: boundaries must be exact, not merely close.
func TestLRTable(t *testing.T) {
	const (
		constant = coordinator.LRConstant
		linear   = coordinator.LRLinear
		cosine   = coordinator.LRCosine
		wsd      = coordinator.LRWarmupStableDecay
	)
	cos := func(base, final float64, d, D float64) float32 {
		return float32(final + (base-final)*0.5*(1+math.Cos(math.Pi*d/D)))
	}
	for _, tc := range []struct {
		name string
		s    coordinator.LRSchedule
		step uint32
		want float32
	}{
		// Constant.
		{"constant no warmup step 0", sched(constant, 0.5, 0, 0, 0, 0), 0, 0.5},
		{"constant no warmup step 1", sched(constant, 0.5, 0, 0, 0, 0), 1, 0.5},
		{"constant no warmup last step", sched(constant, 0.5, 0, 0, 0, 0), math.MaxUint32, 0.5},
		{"constant warmup step 0", sched(constant, 1, 0, 4, 0, 0), 0, 0},
		{"constant warmup step 1", sched(constant, 1, 0, 4, 0, 0), 1, 0.25},
		{"constant warmup step 2", sched(constant, 1, 0, 4, 0, 0), 2, 0.5},
		{"constant warmup end", sched(constant, 1, 0, 4, 0, 0), 4, 1},
		{"constant after warmup", sched(constant, 1, 0, 4, 0, 0), 5, 1},
		{"constant warmup end inexact base", sched(constant, 3e-4, 0, 3, 0, 0), 3, 3e-4},
		{"constant warmup 1/3", sched(constant, 3e-4, 0, 3, 0, 0), 1, float32(float64(float32(3e-4)) / 3)},
		{"constant ignores final", sched(constant, 2, 7, 0, 5, 9), 100, 2},
		{"constant warmup huge", sched(constant, 1, 0, math.MaxUint32, 0, 0), math.MaxUint32, 1},

		// Linear.
		{"linear warmup end", sched(linear, 1, 0, 2, 4, 0), 2, 1},
		{"linear warmup half", sched(linear, 1, 0, 2, 4, 0), 1, 0.5},
		{"linear decay 1/4", sched(linear, 1, 0, 2, 4, 0), 3, 0.75},
		{"linear decay 1/2", sched(linear, 1, 0, 2, 4, 0), 4, 0.5},
		{"linear decay 3/4", sched(linear, 1, 0, 2, 4, 0), 5, 0.25},
		{"linear decay end", sched(linear, 1, 0, 2, 4, 0), 6, 0},
		{"linear after decay", sched(linear, 1, 0, 2, 4, 0), 1000, 0},
		{"linear to final", sched(linear, 1, 0.5, 0, 2, 0), 1, 0.75},
		{"linear final exact", sched(linear, 3e-4, 3e-5, 10, 90, 0), 100, 3e-5},
		{"linear base exact", sched(linear, 3e-4, 3e-5, 10, 90, 0), 10, 3e-4},
		{"linear no warmup step 0", sched(linear, 1, 0, 0, 4, 0), 0, 1},
		{"linear zero decay", sched(linear, 1, 0.25, 2, 0, 0), 2, 1},
		{"linear zero decay after", sched(linear, 1, 0.25, 2, 0, 0), 3, 0.25},
		{"linear rising", sched(linear, 1, 2, 0, 4, 0), 2, 1.5},
		{"linear last step", sched(linear, 1, 0.125, 0, math.MaxUint32, 0), math.MaxUint32, 0.125},

		// Cosine.
		{"cosine warmup", sched(cosine, 1, 0, 4, 4, 0), 3, 0.75},
		{"cosine start", sched(cosine, 1, 0, 4, 4, 0), 4, 1},
		{"cosine quarter", sched(cosine, 1, 0, 4, 4, 0), 5, cos(1, 0, 1, 4)},
		{"cosine middle", sched(cosine, 1, 0, 4, 4, 0), 6, 0.5},
		{"cosine three quarters", sched(cosine, 1, 0, 4, 4, 0), 7, cos(1, 0, 3, 4)},
		{"cosine end", sched(cosine, 1, 0, 4, 4, 0), 8, 0},
		{"cosine after", sched(cosine, 1, 0, 4, 4, 0), 9, 0},
		{"cosine to final middle", sched(cosine, 1, 0.5, 0, 2, 0), 1, 0.75},
		{"cosine final exact", sched(cosine, 6e-4, 6e-5, 100, 900, 0), 1000, 6e-5},
		{"cosine near end", sched(cosine, 6e-4, 6e-5, 100, 900, 0), 999, cos(float64(float32(6e-4)), float64(float32(6e-5)), 899, 900)},

		// Warmup-stable-decay.
		{"wsd warmup", sched(wsd, 1, 0, 2, 4, 10), 1, 0.5},
		{"wsd warmup end", sched(wsd, 1, 0, 2, 4, 10), 2, 1},
		{"wsd stable", sched(wsd, 1, 0, 2, 4, 10), 3, 1},
		{"wsd decay start", sched(wsd, 1, 0, 2, 4, 10), 6, 1},
		{"wsd decay 1/4", sched(wsd, 1, 0, 2, 4, 10), 7, 0.75},
		{"wsd decay 3/4", sched(wsd, 1, 0, 2, 4, 10), 9, 0.25},
		{"wsd total", sched(wsd, 1, 0, 2, 4, 10), 10, 0},
		{"wsd after total", sched(wsd, 1, 0, 2, 4, 10), 11, 0},
		{"wsd decay to final", sched(wsd, 1, 0.5, 0, 2, 4), 3, 0.75},
		{"wsd no decay at total", sched(wsd, 1, 0.5, 0, 0, 4), 4, 1},
		{"wsd no decay after total", sched(wsd, 1, 0.5, 0, 0, 4), 5, 0.5},
		{"wsd all decay", sched(wsd, 1, 0, 0, 4, 4), 0, 1},
		{"wsd all decay step 2", sched(wsd, 1, 0, 0, 4, 4), 2, 0.5},
		{"wsd warmup meets decay", sched(wsd, 1, 0, 2, 2, 4), 2, 1},
		{"wsd warmup meets decay next", sched(wsd, 1, 0, 2, 2, 4), 3, 0.5},
		{"wsd max total", sched(wsd, 1, 0, 0, 2, math.MaxUint32), math.MaxUint32 - 1, 0.5},
		{"wsd invalid decay longer than total", sched(wsd, 1, 0, 0, 8, 4), 2, 0.25},

		// Bad input never yields a bad rate.
		{"none", sched(coordinator.LRNone, 1, 1, 0, 0, 0), 5, 0},
		{"unknown kind", sched(99, 1, 1, 0, 0, 0), 5, 0},
		{"negative base", sched(constant, -1, 0, 0, 0, 0), 5, 0},
		{"nan base", sched(constant, float32(math.NaN()), 0, 2, 0, 0), 1, 0},
		{"inf base", sched(constant, float32(math.Inf(1)), 0, 0, 0, 0), 1, 0},
		{"nan final", sched(linear, 1, float32(math.NaN()), 0, 2, 0), 2, 0},
		{"negative final", sched(linear, 1, -1, 0, 2, 0), 1, 0.5},
	} {
		if got := LR(tc.s, tc.step); got != tc.want || math.Signbit(float64(got)) {
			t.Errorf("%s: LR(%+v, %d) = %v, want %v", tc.name, tc.s, tc.step, got, tc.want)
		}
	}
}

// randomSchedule draws a valid schedule. Small step counts make boundary
// cases common; the rates cover the magnitudes used in practice and cases
// where FinalLR is above BaseLR.
func randomSchedule(r *rand.Rand) coordinator.LRSchedule {
	kinds := []coordinator.LRScheduleKind{coordinator.LRConstant, coordinator.LRLinear, coordinator.LRCosine, coordinator.LRWarmupStableDecay}
	base := float32(math.Pow(10, -6+5*r.Float64()))
	var final float32
	switch r.IntN(4) {
	case 0:
		final = 0
	case 1:
		final = base
	case 2:
		final = base * float32(r.Float64())
	default:
		final = base * float32(1+3*r.Float64())
	}
	s := coordinator.LRSchedule{Kind: kinds[r.IntN(len(kinds))], BaseLR: base, FinalLR: final,
		WarmupSteps: uint32(r.IntN(50)), DecaySteps: uint32(r.IntN(300))}
	s.TotalSteps = s.WarmupSteps + s.DecaySteps + uint32(r.IntN(100))
	return s
}

// end is one step past the last phase boundary of s.
func end(s coordinator.LRSchedule) uint32 {
	return max(s.WarmupSteps+s.DecaySteps, s.TotalSteps) + 2
}

func TestLRProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		s := randomSchedule(r)
		if err := Validate(s); err != nil {
			t.Fatalf("randomSchedule drew an invalid schedule %+v: %v", s, err)
		}
		hi := max(s.BaseLR, s.FinalLR)
		lo := min(s.BaseLR, s.FinalLR)
		// The largest legitimate change between two adjacent steps: the
		// warmup slope, or the steepest point of a decay (π/2 times the
		// linear slope for a cosine). A few ulps cover rounding.
		maxJump := float64(hi) * 4e-7
		if s.WarmupSteps > 0 {
			maxJump += float64(s.BaseLR) / float64(s.WarmupSteps)
		}
		decayJump := math.Abs(float64(s.BaseLR)-float64(s.FinalLR)) * math.Pi / 2
		if s.DecaySteps > 0 {
			decayJump /= float64(s.DecaySteps)
		} // else the one jump from BaseLR to FinalLR is allowed

		decayStart, decayEnd := s.WarmupSteps, s.WarmupSteps+s.DecaySteps
		if s.Kind == coordinator.LRWarmupStableDecay {
			decayStart, decayEnd = s.TotalSteps-s.DecaySteps, s.TotalSteps
		}
		prev := LR(s, 0)
		for step := uint32(0); step <= end(s); step++ {
			v := LR(s, step)
			if !(v >= 0) || v > hi || math.Signbit(float64(v)) {
				t.Fatalf("%+v step %d: LR = %v, outside [0, %v]", s, step, v, hi)
			}
			if s.WarmupSteps > 0 && step == s.WarmupSteps && v != s.BaseLR {
				t.Fatalf("%+v: LR at the end of warmup = %v, want BaseLR", s, v)
			}
			if step > 0 {
				d := math.Abs(float64(v) - float64(prev))
				if d > maxJump+decayJump {
					t.Fatalf("%+v step %d: jump %v -> %v larger than %v", s, step, prev, v, maxJump+decayJump)
				}
				if step <= s.WarmupSteps && v < prev {
					t.Fatalf("%+v step %d: warmup decreases %v -> %v", s, step, prev, v)
				}
			}
			inDecay := s.Kind != coordinator.LRConstant && step > decayStart && step <= decayEnd && step > s.WarmupSteps
			if inDecay {
				if v < lo || v > hi {
					t.Fatalf("%+v step %d: decay value %v outside [%v, %v]", s, step, v, lo, hi)
				}
				if s.FinalLR <= s.BaseLR && v > prev || s.FinalLR > s.BaseLR && v < prev {
					t.Fatalf("%+v step %d: decay not monotone %v -> %v", s, step, prev, v)
				}
			}
			// A zero-length decay switches to FinalLR on the step after its end.
			pastDecay := step > decayEnd || step == decayEnd && s.DecaySteps > 0
			if s.Kind != coordinator.LRConstant && pastDecay && step > s.WarmupSteps && v != s.FinalLR {
				t.Fatalf("%+v step %d: after the decay LR = %v, want FinalLR %v", s, step, v, s.FinalLR)
			}
			prev = v
		}
	}
}

// TestCosineMonotoneLong checks monotonicity where adjacent steps differ by
// less than a float32 ulp, which is where rounding could make a decay rise.
func TestCosineMonotoneLong(t *testing.T) {
	for _, kind := range []coordinator.LRScheduleKind{coordinator.LRCosine, coordinator.LRLinear, coordinator.LRWarmupStableDecay} {
		s := sched(kind, 6e-4, 6e-5, 1000, 2_000_000, 2_001_000)
		prev := LR(s, 1000)
		for step := uint32(1001); step <= 2_001_001; step++ {
			v := LR(s, step)
			if v > prev {
				t.Fatalf("kind %d step %d: %v > %v", kind, step, v, prev)
			}
			prev = v
		}
		if prev != s.FinalLR {
			t.Fatalf("kind %d: ends at %v, want %v", kind, prev, s.FinalLR)
		}
	}
}

func TestLRIsAFunctionOfTheStepAlone(t *testing.T) {
	// Two trainers that compute the same step in a different order must agree
	// bit for bit.
	r := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		s := randomSchedule(r)
		step := uint32(r.IntN(int(end(s)) + 1))
		a := LR(s, step)
		for range 3 {
			LR(s, uint32(r.Uint32()))
		}
		if b := LR(s, step); math.Float32bits(a) != math.Float32bits(b) {
			t.Fatalf("%+v step %d: %v then %v", s, step, a, b)
		}
	}
}

func TestValidate(t *testing.T) {
	good := sched(coordinator.LRWarmupStableDecay, 1e-3, 1e-4, 10, 20, 30)
	if err := Validate(good); err != nil {
		t.Fatalf("valid schedule rejected: %v", err)
	}
	for _, tc := range []struct {
		name string
		s    coordinator.LRSchedule
		want string
	}{
		{"none", sched(coordinator.LRNone, 1, 0, 0, 0, 0), "kind 0"},
		{"unknown", sched(9, 1, 0, 0, 0, 0), "kind 9"},
		{"zero base", sched(coordinator.LRConstant, 0, 0, 0, 0, 0), "base_lr"},
		{"nan base", sched(coordinator.LRConstant, float32(math.NaN()), 0, 0, 0, 0), "base_lr"},
		{"inf base", sched(coordinator.LRConstant, float32(math.Inf(1)), 0, 0, 0, 0), "base_lr"},
		{"negative final", sched(coordinator.LRLinear, 1, -1, 0, 0, 0), "final_lr"},
		{"inf final", sched(coordinator.LRLinear, 1, float32(math.Inf(1)), 0, 0, 0), "final_lr"},
		{"wsd too long", sched(coordinator.LRWarmupStableDecay, 1, 0, 5, 6, 10), "exceed total_steps"},
		{"wsd overflow", sched(coordinator.LRWarmupStableDecay, 1, 0, math.MaxUint32, math.MaxUint32, math.MaxUint32), "exceed total_steps"},
	} {
		err := Validate(tc.s)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "schedule: ") {
			t.Errorf("%s: Validate = %v, want an ErrInvalid mentioning %q", tc.name, err, tc.want)
		}
	}
}

// TestValidateAgreesWithCoordinator keeps the two validators from drifting
// apart: a schedule is accepted here iff the coordinator accepts a model that
// carries it.
func TestValidateAgreesWithCoordinator(t *testing.T) {
	m := coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
		MaxSeqLen: 64, VocabSize: 256, DModel: 64, NLayers: 2, NHeads: 4,
		Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerAdamW, Beta1: 0.9, Beta2: 0.95, Epsilon: 1e-8}}
	m.Checkpoint.Kind = coordinator.CheckpointHub
	copy(m.Checkpoint.Source.URL[:], "file:///x")
	copy(m.DataLocation[:], "/data")
	if err := m.Validate(); err == nil {
		t.Fatal("model without a schedule was accepted; the fixture is wrong")
	}
	r := rand.New(rand.NewPCG(5, 6))
	odd := []float32{0, -1, float32(math.NaN()), float32(math.Inf(1)), 1e-3}
	for range 2000 {
		s := coordinator.LRSchedule{Kind: coordinator.LRScheduleKind(r.IntN(6)),
			BaseLR: odd[r.IntN(len(odd))], FinalLR: odd[r.IntN(len(odd))],
			WarmupSteps: uint32(r.IntN(10)), DecaySteps: uint32(r.IntN(10)), TotalSteps: uint32(r.IntN(20))}
		m.LR = s
		if ours, theirs := Validate(s) == nil, m.Validate() == nil; ours != theirs {
			t.Fatalf("%+v: schedule.Validate ok=%v, coordinator ok=%v (%v)", s, ours, theirs, m.Validate())
		}
	}
}

func BenchmarkLR(b *testing.B) {
	s := sched(coordinator.LRCosine, 6e-4, 6e-5, 100, 10000, 0)
	var sink float32
	for i := 0; b.Loop(); i++ {
		sink += LR(s, uint32(i%12000))
	}
	_ = sink
}
