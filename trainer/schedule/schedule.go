package schedule

import (
	"errors"
	"fmt"
	"math"

	"github.com/psyche-go/psyche/coordinator"
)

// ErrInvalid is wrapped by every error of Validate, so callers can tell a bad
// schedule from other failures with errors.Is.
var ErrInvalid = errors.New("schedule: invalid learning-rate schedule")

// LR is the learning rate at optimizer step step (numbered from 1) under
// schedule s. The conventions for each kind are in the package documentation.
//
// The result is exact at phase boundaries: BaseLR at the end of warmup and at
// the start of a decay, FinalLR at the end of a decay. It always lies in
// [0, max(BaseLR, FinalLR)], and inside a decay phase between FinalLR and
// BaseLR.
func LR(s coordinator.LRSchedule, step uint32) float32 {
	base, final := sanitize(s.BaseLR), sanitize(s.FinalLR)
	switch s.Kind {
	case coordinator.LRConstant, coordinator.LRLinear, coordinator.LRCosine, coordinator.LRWarmupStableDecay:
	default:
		return 0
	}
	if w := s.WarmupSteps; w > 0 && step <= w {
		// The ratio is computed first so that step == w gives exactly 1 and
		// the rate exactly base; multiplying base·step first could round.
		return float32(float64(step) / float64(w) * base)
	}
	switch s.Kind {
	case coordinator.LRConstant:
		return float32(base)
	case coordinator.LRLinear, coordinator.LRCosine:
		d := uint64(step) - uint64(s.WarmupSteps) // step > WarmupSteps here, or WarmupSteps == 0
		if d >= uint64(s.DecaySteps) {
			return float32(final)
		}
		x := float64(d) / float64(s.DecaySteps) // in [0, 1)
		f := 1 - x
		if s.Kind == coordinator.LRCosine {
			f = 0.5 * (1 + math.Cos(math.Pi*x))
		}
		return interpolate(base, final, f)
	default: // coordinator.LRWarmupStableDecay
		// int64 because TotalSteps − DecaySteps may be negative in a schedule
		// the coordinator would reject.
		total := int64(s.TotalSteps)
		start := total - int64(s.DecaySteps)
		switch st := int64(step); {
		case st <= start:
			return float32(base)
		case st >= total:
			return float32(final)
		default:
			return interpolate(base, final, float64(total-st)/float64(s.DecaySteps))
		}
	}
}

// interpolate returns final + (base−final)·f for f in [0, 1], rounded to
// float32 and clamped to the interval between the two rates. The form
// final + c·f (c fixed) keeps the result monotone in f, and f == 1 gives base
// and f == 0 gives final once rounded to float32; the clamp only guards
// against a last-bit overshoot in float64.
func interpolate(base, final, f float64) float32 {
	v := final + (base-final)*f
	lo, hi := min(base, final), max(base, final)
	return float32(min(max(v, lo), hi))
}

// sanitize maps a rate that could only make training diverge (negative, NaN
// or infinite) to 0, so LR's output is always a usable step size.
func sanitize(x float32) float64 {
	v := float64(x)
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

// Validate reports why s is not a usable schedule: an unknown kind, a BaseLR
// that is not positive and finite, a FinalLR that is negative or not finite,
// or a warmup-stable-decay schedule whose warmup and decay do not fit in
// TotalSteps. It applies the same rules as coordinator.Model.Validate, so a
// trainer can check a schedule it did not receive from the coordinator.
func Validate(s coordinator.LRSchedule) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
	}
	switch s.Kind {
	case coordinator.LRConstant, coordinator.LRLinear, coordinator.LRCosine, coordinator.LRWarmupStableDecay:
	default:
		bad("kind %d is unknown", s.Kind)
	}
	if b := float64(s.BaseLR); !(b > 0) || math.IsInf(b, 1) {
		bad("base_lr %v must be positive and finite", s.BaseLR)
	}
	if f := float64(s.FinalLR); !(f >= 0) || math.IsInf(f, 1) {
		bad("final_lr %v must be non-negative and finite", s.FinalLR)
	}
	if s.Kind == coordinator.LRWarmupStableDecay && uint64(s.WarmupSteps)+uint64(s.DecaySteps) > uint64(s.TotalSteps) {
		bad("warmup_steps (%d) + decay_steps (%d) exceed total_steps (%d)", s.WarmupSteps, s.DecaySteps, s.TotalSteps)
	}
	return errors.Join(errs...)
}
