package kernels

import (
	"math"
	"testing"
)

// TestExp32 compares exp32 with math.Exp rounded to float32 over the
// whole range it covers, densely near 0 (softmax inputs), at the limits and
// at the special values.
func TestExp32(t *testing.T) {
	ulps := func(got, want float32) float64 {
		if got == want {
			return 0
		}
		if want == 0 || math.IsInf(float64(want), 0) {
			return math.Inf(1)
		}
		return math.Abs(float64(got-want)) / float64(math.Nextafter32(float32(math.Abs(float64(want))), float32(math.Inf(1)))-float32(math.Abs(float64(want))))
	}
	worst := 0.0
	check := func(x float32) {
		want := float32(math.Exp(float64(x)))
		got := exp32(x)
		if want != 0 && want < math.SmallestNonzeroFloat32*(1<<23) {
			// Subnormal results carry fewer bits: compare absolutely.
			if math.Abs(float64(got-want)) > 4*math.SmallestNonzeroFloat32 {
				t.Fatalf("exp32(%v) = %v, want %v", x, got, want)
			}
			return
		}
		u := ulps(got, want)
		worst = max(worst, u)
		if u > 2 {
			t.Fatalf("exp32(%v) = %v, want %v (%.1f ulp)", x, got, want, u)
		}
	}
	for x := float32(-103.9); x <= 88.7; x += 0.0137 {
		check(x)
	}
	for x := float32(-1); x <= 1; x += 1.0 / 4096 {
		check(x)
	}
	for _, x := range []float32{0, -0, 1e-30, -1e-30, 88.72, -87.33, -100, -103.97, 88.7228} {
		check(x)
	}
	for _, tc := range []struct{ x, want float32 }{
		{float32(math.Inf(1)), float32(math.Inf(1))}, {float32(math.Inf(-1)), 0}, {89, float32(math.Inf(1))}, {-200, 0},
	} {
		if got := exp32(tc.x); got != tc.want {
			t.Fatalf("exp32(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
	if got := exp32(float32(math.NaN())); got == got {
		t.Fatalf("exp32(NaN) = %v", got)
	}
	t.Logf("worst error: %.2f ulp", worst)
}
