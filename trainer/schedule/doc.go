// Package schedule computes the learning rate of a psyche run (docs/architecture.md §3.2)
// as a pure function of the optimizer step.
//
// Every trainer of a run must apply exactly the same learning rate at the same
// step, whatever machine it runs on and whenever it joined, so the rate is a
// function of the coordinator's LRSchedule and the step alone: no state, no
// clock, no randomness. The arithmetic is done in float64 and rounded once to
// float32, which is exact at every phase boundary (see LR).
//
// # Step convention
//
// Steps are numbered from 1, like the coordinator's Progress.Step: step s is
// the s-th optimizer update. With W = WarmupSteps, B = BaseLR, F = FinalLR and
// D = DecaySteps:
//
//   - Warmup (all kinds, only when W > 0): for 0 ≤ s ≤ W the rate is B·s/W, a
//     line from 0 that reaches B exactly at the last warmup step s = W. Step 1
//     already gets B/W, so no update is wasted on a zero rate; step 0 (which a
//     run never trains) gets 0.
//   - Constant: B for every s > W.
//   - Linear and cosine: with d = s − W the steps since warmup ended, the rate
//     goes from B at d = 0 to F at d = D, linearly or along half a cosine
//     (F + (B−F)·(1+cos(π·d/D))/2), and stays F for d ≥ D. D = 0 therefore
//     means "switch to F right after warmup".
//   - Warmup-stable-decay (WSD): B until step T−D where T = TotalSteps, then a
//     line from B at s = T−D to F at s = T, then F. D = 0 means no decay tail:
//     B up to T and F after it. The coordinator requires W + D ≤ T; for
//     schedules that break this rule LR still returns a bounded value (the
//     warmup wins while s ≤ W, the decay line after it) but they are not
//     meaningful.
//
// Every phase is continuous with the next one except where a zero-length
// phase makes a jump unavoidable (D = 0 with F ≠ B).
//
// # Bad input
//
// LR never panics and never returns a negative, infinite or NaN rate: a
// negative or non-finite BaseLR or FinalLR counts as 0, and an unknown Kind
// (including LRNone) gives 0, so a trainer fed an unvalidated schedule stops
// learning rather than diverging. Validate reports such schedules; the
// coordinator rejects them before a run can start.
package schedule
