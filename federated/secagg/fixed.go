package secagg

import (
	"errors"
	"fmt"
	"math"
)

// ErrRange reports a value outside the clipping bound that fixed point was
// sized for (it would wrap around in the sum).
var ErrRange = errors.New("secagg: value outside the clipping bound")

// FractionBits is the largest F ≤ 24 for which the sum of n values in
// [−bound, bound] encoded with F fractional bits cannot overflow a signed
// 32-bit number: n·bound·2^F < 2³¹. It is an error if even F = 0 fails.
func FractionBits(n int, bound float64) (int, error) {
	if n < 1 || !(bound > 0) || math.IsInf(bound, 0) {
		return 0, fmt.Errorf("secagg: %d clients with bound %v", n, bound)
	}
	for f := 24; f >= 0; f-- {
		if float64(n)*bound*math.Ldexp(1, f) < math.Ldexp(1, 31)-1 {
			return f, nil
		}
	}
	return 0, fmt.Errorf("secagg: %d clients with bound %v overflow 32 bits", n, bound)
}

// Encode maps x (every |value| ≤ bound) to fixed point with f fractional
// bits, mod 2³².
func Encode(x []float32, bound float64, f int) ([]uint32, error) {
	out := make([]uint32, len(x))
	scale := math.Ldexp(1, f)
	for i, v := range x {
		a := math.Abs(float64(v))
		if !(a <= bound*(1+1e-6)) {
			return nil, fmt.Errorf("%w: value %d is %v, bound %v", ErrRange, i, v, bound)
		}
		// Float32 rounding of a clipped update may pass the bound by an ulp.
		q := math.Round(math.Max(-bound, math.Min(bound, float64(v))) * scale)
		out[i] = uint32(int32(q))
	}
	return out, nil
}

// Decode reads a sum of fixed-point values as signed numbers.
func Decode(sum []uint32, f int) []float32 {
	out := make([]float32, len(sum))
	scale := math.Ldexp(1, -f)
	for i, v := range sum {
		out[i] = float32(float64(int32(v)) * scale)
	}
	return out
}
