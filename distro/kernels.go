package distro

import "math"

// Row kernels: the element-wise loops the transform and the optimizer spend
// their time in. On amd64 with AVX2 they run as vector code
// (kernels_amd64.s); everywhere else, and as the reference the vector code is
// tested against, as the plain Go below. Both compute each element with the
// same sequence of float32 operations (no fused multiply-add), so results are
// bit-identical.

func butterflyGo(u, v, a, b []float32, g float32) {
	u = u[:len(a)]
	v = v[:len(a)]
	b = b[:len(a)]
	for i, x := range a {
		y := b[i]
		u[i] = x + y
		v[i] = (x - y) * g
	}
}

func unbutterflyGo(x, y, u, v []float32, g float32) {
	y = y[:len(x)]
	u = u[:len(x)]
	v = v[:len(x)]
	for i := range x {
		a, d := u[i], v[i]*g
		x[i] = a + d
		y[i] = a - d
	}
}

func addGo(dst, a, b []float32) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

func axpyGo(dst []float32, c float32, x []float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += c * x[i]
	}
}

// momentumGo computes m = beta·m + scale·c.
func momentumGo(m, c []float32, beta, scale float32) {
	c = c[:len(m)]
	for i := range m {
		m[i] = beta*m[i] + scale*c[i]
	}
}

// meanSquareGo folds c² into the running mean squares v, in float64 (m =
// β·v + w·c·c with w = 1 − β, kept in v as float32), and adds each m to
// sums[j mod 4]: four partial sums, so the vector kernel's lanes and this
// loop add in the same order.
func meanSquareGo(v, c []float32, beta, w float64, sums *[4]float64) {
	c = c[:len(v)]
	for j := range v {
		x := float64(c[j])
		m := beta*float64(v[j]) + w*x*x
		v[j] = float32(m)
		sums[j%4] += m
	}
}

// rmsDivideGo computes c = c / (√(v·unbias) + floor), in float32.
func rmsDivideGo(c, v []float32, unbias, floor float32) {
	v = v[:len(c)]
	for j, x := range c {
		c[j] = x / (float32(math.Sqrt(float64(v[j]*unbias))) + floor)
	}
}

func nextAboveGo(v []float32, from int, thr uint32) int {
	for i := from; i < len(v); i++ {
		if math.Float32bits(v[i])&^(1<<31) > thr {
			return i
		}
	}
	return len(v)
}
