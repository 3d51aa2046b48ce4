package dp

import (
	"math"
	"testing"
)

// TestRDPMatchesTFPrivacy checks compute_rdp's published values
// (tensorflow/privacy, rdp_accountant_test.py: test_compute_rdp).
func TestRDPMatchesTFPrivacy(t *testing.T) {
	got, err := RDP(0.1, 2, 10, []float64{5})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(got[0]-0.07737) > 5e-6 {
		t.Errorf("q=0.1 σ=2 10 steps, order 5: %v, want 0.07737", got[0])
	}
	orders := []float64{1.5, 2.5, 5, 50, 100, math.Inf(1)}
	want := []float64{0.00065, 0.001085, 0.00218075, 0.023846, 167.416307, math.Inf(1)}
	got, err = RDP(0.01, 2.5, 50, orders)
	if err != nil {
		t.Fatal(err)
	}
	for i := range orders {
		if math.IsInf(want[i], 1) != math.IsInf(got[i], 1) || (!math.IsInf(want[i], 1) && math.Abs(got[i]-want[i]) > 1e-5) {
			t.Errorf("q=0.01 σ=2.5 50 steps, order %v: %v, want %v", orders[i], got[i], want[i])
		}
	}
	if r, _ := RDP(1, 10, 1, []float64{20}); r[0] != 0.1 {
		t.Errorf("q=1: %v, want α/(2σ²) = 0.1", r[0])
	}
	if r, _ := RDP(0, 10, 1, []float64{20}); r[0] != 0 {
		t.Errorf("q=0: %v, want 0", r[0])
	}
}

// TestEpsilonMatchesTFPrivacy checks get_privacy_spent's published values,
// which use the classic conversion
// (rdp_accountant_test.py: test_get_privacy_spent_check_target_delta and
// test_check_composition).
func TestEpsilonMatchesTFPrivacy(t *testing.T) {
	var orders []float64
	for a := 2; a <= 32; a++ {
		orders = append(orders, float64(a))
	}
	rdp, _ := RDP(0.01, 4, 10000, orders)
	eps, order, err := EpsilonClassic(orders, rdp, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(eps-1.258575) > 5e-6 || order != 20 {
		t.Errorf("q=0.01 σ=4 10000 steps δ=1e-5: ε=%v at order %v, want 1.258575 at 20", eps, order)
	}
	orders = []float64{1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 64, 256}
	a, _ := RDP(1e-4, 0.4, 40000, orders)
	b, _ := RDP(0.1, 2, 100, orders)
	for i := range a {
		a[i] += b[i]
	}
	eps, order, err = EpsilonClassic(orders, a, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(eps-8.509656) > 5e-6 || order != 2.5 {
		t.Errorf("composition: ε=%v at order %v, want 8.509656 at 2.5", eps, order)
	}
}

// TestEpsilonMatchesOpacus checks Opacus's published value
// (opacus/tests/accountants_test.py: test_rdp_accountant): σ=1.5, q=0.04,
// 90 epochs (2250 steps), δ=1e-5 gives ε=7.32911117143 with its default
// orders and Balle et al.'s conversion.
func TestEpsilonMatchesOpacus(t *testing.T) {
	eps, _, err := Accountant{Q: 0.04, Sigma: 1.5}.Spent(2250, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(eps-7.32911117143) > 1e-7 {
		t.Errorf("ε=%.11f, want 7.32911117143", eps)
	}
}

func TestAccountantReport(t *testing.T) {
	eps, order, err := Accountant{Q: 0.01, Sigma: 1.1}.Spent(10000, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("q=0.01 σ=1.1 10000 steps δ=1e-5: ε=%.4f (order %v)", eps, order)
	eps2, _, _ := Accountant{Q: 0.01, Sigma: 1.1}.Spent(20000, 1e-5)
	if !(eps2 > eps) {
		t.Errorf("ε does not grow with steps: %v then %v", eps, eps2)
	}
	s, err := NoiseFor(8, 1, 10, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	e, _, _ := Accountant{Q: 1, Sigma: s}.Spent(10, 1e-5)
	if e > 8 || e < 7.99 {
		t.Errorf("NoiseFor(8): σ=%v gives ε=%v", s, e)
	}
}

func TestNoiseIsStandardNormalAndReplayable(t *testing.T) {
	n := NewNoise([32]byte{1})
	var s, s2 float64
	const k = 200000
	for range k {
		x := n.Normal()
		s += x
		s2 += x * x
	}
	mean, variance := s/k, s2/k-(s/k)*(s/k)
	if math.Abs(mean) > 0.01 || math.Abs(variance-1) > 0.02 {
		t.Errorf("mean %v variance %v", mean, variance)
	}
	a, b := make([]float32, 10), make([]float32, 10)
	NewNoise([32]byte{2}).Add(a, 1)
	NewNoise([32]byte{2}).Add(b, 1)
	for i := range a {
		if a[i] != b[i] || a[i] == 0 {
			t.Fatalf("noise of one seed differs or is zero: %v %v", a, b)
		}
	}
	v := []float32{3, 4}
	if norm := Clip(v, 1); norm != 5 || math.Abs(float64(v[0])-0.6) > 1e-6 || math.Abs(float64(v[1])-0.8) > 1e-6 {
		t.Errorf("Clip: norm %v, %v", norm, v)
	}
}
