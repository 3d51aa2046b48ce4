package dp

import (
	"errors"
	"fmt"
	"math"
)

// DefaultOrders are the Rényi orders the accountant tracks (Opacus's
// defaults: 1.1 to 10.9 in tenths, then 12 to 63).
var DefaultOrders = func() []float64 {
	var o []float64
	for x := 1; x < 100; x++ {
		o = append(o, 1+float64(x)/10)
	}
	for a := 12; a < 64; a++ {
		o = append(o, float64(a))
	}
	return o
}()

// ErrParams is returned for a sampling rate outside [0, 1], a negative noise
// multiplier, or a δ outside (0, 1).
var ErrParams = errors.New("dp: bad accountant parameters")

// RDP returns the Rényi DP of steps compositions of the sampled Gaussian
// mechanism with sampling rate q and noise multiplier sigma (noise standard
// deviation over sensitivity), at each order. It is TF-Privacy's
// compute_rdp: the exact sum for integer orders, the two-sided series of
// Mironov et al. (Section 3.3) for fractional ones.
func RDP(q, sigma float64, steps uint64, orders []float64) ([]float64, error) {
	if !(q >= 0 && q <= 1) || !(sigma >= 0) {
		return nil, fmt.Errorf("%w: q=%v sigma=%v", ErrParams, q, sigma)
	}
	out := make([]float64, len(orders))
	for i, a := range orders {
		if !(a > 1) {
			return nil, fmt.Errorf("%w: order %v must exceed 1", ErrParams, a)
		}
		out[i] = rdpOne(q, sigma, a) * float64(steps)
	}
	return out, nil
}

func rdpOne(q, sigma, alpha float64) float64 {
	switch {
	case q == 0:
		return 0
	case sigma == 0 || math.IsInf(alpha, 1):
		return math.Inf(1)
	case q == 1:
		return alpha / (2 * sigma * sigma)
	}
	var logA float64
	if alpha == math.Floor(alpha) {
		logA = logAInt(q, sigma, int(alpha))
	} else {
		logA = logAFrac(q, sigma, alpha)
	}
	return logA / (alpha - 1)
}

// logAdd is log(e^a + e^b).
func logAdd(a, b float64) float64 {
	lo, hi := min(a, b), max(a, b)
	if math.IsInf(lo, -1) {
		return hi
	}
	return math.Log1p(math.Exp(lo-hi)) + hi
}

// logSub is log(e^a - e^b) for a ≥ b.
func logSub(a, b float64) float64 {
	if math.IsInf(b, -1) {
		return a
	}
	if a <= b {
		return math.Inf(-1)
	}
	return math.Log(math.Expm1(a-b)) + b
}

func logBinom(n, k float64) float64 {
	a, _ := math.Lgamma(n + 1)
	b, _ := math.Lgamma(k + 1)
	c, _ := math.Lgamma(n - k + 1)
	return a - b - c
}

// logAInt is log A_α for integer α: log Σ_i C(α,i) q^i (1-q)^(α-i) e^((i²-i)/(2σ²)).
func logAInt(q, sigma float64, alpha int) float64 {
	logA := math.Inf(-1)
	for i := 0; i <= alpha; i++ {
		fi := float64(i)
		s := logBinom(float64(alpha), fi) + fi*math.Log(q) + float64(alpha-i)*math.Log(1-q) + (fi*fi-fi)/(2*sigma*sigma)
		logA = logAdd(logA, s)
	}
	return logA
}

// logErfc is log(erfc(x)). Past x = 10, where erfc heads for the
// subnormal range and loses its digits, it is the asymptotic series
// log erfc(x) = −x² − log x − ½ log π − 1/(2x²) + 5/(8x⁴) − 37/(24x⁶) + 353/(64x⁸) + O(x⁻¹⁰).
func logErfc(x float64) float64 {
	if x <= 10 {
		return math.Log(math.Erfc(x))
	}
	x2 := x * x
	return -x2 - math.Log(x) - 0.5*math.Log(math.Pi) - 0.5/x2 + 0.625/(x2*x2) - 37.0/24/(x2*x2*x2) + 353.0/64/(x2*x2*x2*x2)
}

// logAFrac is log A_α for fractional α (the series runs until its terms
// fall below e^-30).
func logAFrac(q, sigma, alpha float64) float64 {
	a0, a1 := math.Inf(-1), math.Inf(-1)
	z0 := sigma*sigma*math.Log(1/q-1) + 0.5
	for i := 0.0; ; i++ {
		// C(α, i) for real α: its sign alternates once i exceeds α.
		logCoef := logAbsBinomReal(alpha, i)
		positive := binomRealSign(alpha, i) > 0
		j := alpha - i
		t0 := logCoef + i*math.Log(q) + j*math.Log(1-q)
		t1 := logCoef + j*math.Log(q) + i*math.Log(1-q)
		e0 := math.Log(0.5) + logErfc((i-z0)/(math.Sqrt2*sigma))
		e1 := math.Log(0.5) + logErfc((z0-j)/(math.Sqrt2*sigma))
		s0 := t0 + (i*i-i)/(2*sigma*sigma) + e0
		s1 := t1 + (j*j-j)/(2*sigma*sigma) + e1
		if positive {
			a0, a1 = logAdd(a0, s0), logAdd(a1, s1)
		} else {
			a0, a1 = logSub(a0, s0), logSub(a1, s1)
		}
		if max(s0, s1) < -30 {
			break
		}
	}
	return logAdd(a0, a1)
}

// logAbsBinomReal is log |C(α, i)| for real α and integer i ≥ 0.
func logAbsBinomReal(alpha, i float64) float64 {
	a, _ := math.Lgamma(alpha + 1)
	b, _ := math.Lgamma(i + 1)
	c, _ := math.Lgamma(alpha - i + 1)
	return a - b - c
}

// binomRealSign is the sign of C(α, i) = Γ(α+1)/(Γ(i+1)Γ(α-i+1)): that of
// Γ(α-i+1), negative where α-i+1 lies in (-2k-1, -2k).
func binomRealSign(alpha, i float64) float64 {
	_, s := math.Lgamma(alpha - i + 1)
	return float64(s)
}

// Epsilon converts RDP values at orders into the smallest ε of an (ε, δ)
// guarantee and the order that gave it, with the conversion of Balle et al.
// 2020 ("Hypothesis testing interpretations and Rényi DP", Theorem 21), as
// TF-Privacy's get_privacy_spent and Opacus do:
// ε = rdp − (log δ + log α)/(α−1) + log((α−1)/α).
func Epsilon(orders, rdp []float64, delta float64) (eps, order float64, err error) {
	if !(delta > 0 && delta < 1) || len(orders) != len(rdp) || len(orders) == 0 {
		return 0, 0, fmt.Errorf("%w: delta=%v, %d orders, %d values", ErrParams, delta, len(orders), len(rdp))
	}
	eps = math.Inf(1)
	for i, a := range orders {
		if rdp[i] < 0 || math.IsNaN(rdp[i]) {
			return 0, 0, fmt.Errorf("%w: rdp %v at order %v", ErrParams, rdp[i], a)
		}
		e := rdp[i] - (math.Log(delta)+math.Log(a))/(a-1) + math.Log((a-1)/a)
		if e < eps {
			eps, order = e, a
		}
	}
	return max(eps, 0), order, nil
}

// EpsilonClassic is the older conversion (Mironov 2017, Proposition 3),
// ε = rdp − log δ/(α−1), which TF-Privacy's rdp_accountant used before it
// adopted Balle et al.'s; it is looser, and kept to check against the
// values published with it.
func EpsilonClassic(orders, rdp []float64, delta float64) (eps, order float64, err error) {
	if !(delta > 0 && delta < 1) || len(orders) != len(rdp) || len(orders) == 0 {
		return 0, 0, fmt.Errorf("%w: delta=%v, %d orders, %d values", ErrParams, delta, len(orders), len(rdp))
	}
	eps = math.Inf(1)
	for i, a := range orders {
		if e := rdp[i] - math.Log(delta)/(a-1); e < eps {
			eps, order = e, a
		}
	}
	return max(eps, 0), order, nil
}

// Accountant tracks the privacy spent by a run of the sampled Gaussian
// mechanism with one sampling rate and noise multiplier.
type Accountant struct {
	Q, Sigma float64
	Orders   []float64 // nil: DefaultOrders
}

// Spent is the (ε, δ) guarantee after steps steps, and the best order.
func (a Accountant) Spent(steps uint64, delta float64) (eps, order float64, err error) {
	orders := a.Orders
	if orders == nil {
		orders = DefaultOrders
	}
	if steps == 0 {
		return 0, 0, nil
	}
	rdp, err := RDP(a.Q, a.Sigma, steps, orders)
	if err != nil {
		return 0, 0, err
	}
	return Epsilon(orders, rdp, delta)
}

// NoiseFor finds (by bisection) the smallest noise multiplier whose ε after
// steps steps at rate q and δ is at most target: how to configure a run for
// a privacy budget.
func NoiseFor(target, q float64, steps uint64, delta float64) (float64, error) {
	if !(target > 0) {
		return 0, fmt.Errorf("%w: target ε %v", ErrParams, target)
	}
	eps := func(s float64) float64 {
		e, _, err := Accountant{Q: q, Sigma: s}.Spent(steps, delta)
		if err != nil {
			return math.Inf(1)
		}
		return e
	}
	lo, hi := 0.0, 1.0
	for eps(hi) > target {
		if hi *= 2; hi > 1e6 {
			return 0, fmt.Errorf("%w: no noise multiplier reaches ε %v", ErrParams, target)
		}
	}
	for range 60 {
		mid := (lo + hi) / 2
		if eps(mid) > target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi, nil
}
