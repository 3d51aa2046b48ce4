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

func nextAboveGo(v []float32, from int, thr uint32) int {
	for i := from; i < len(v); i++ {
		if math.Float32bits(v[i])&^(1<<31) > thr {
			return i
		}
	}
	return len(v)
}
