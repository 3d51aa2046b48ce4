//go:build amd64 && !purego

package distro

// hasAVX2 is read once: whether the CPU and the OS support 256-bit vectors.
var hasAVX2 = func() bool {
	_, _, c, _ := cpuid(1, 0)
	const osxsave, avx = 1 << 27, 1 << 28
	if c&osxsave == 0 || c&avx == 0 || xgetbv()&6 != 6 {
		return false
	}
	_, b, _, _ := cpuid(7, 0)
	return b&(1<<5) != 0
}()

const vectorKernels = true

func cpuid(eax, ecx uint32) (a, b, c, d uint32)
func xgetbv() uint32

//go:noescape
func butterflyAVX2(u, v, a, b *float32, n int, gain float32)

//go:noescape
func unbutterflyAVX2(x, y, u, v *float32, n int, gain float32)

//go:noescape
func addAVX2(dst, a, b *float32, n int)

//go:noescape
func axpyAVX2(dst *float32, c float32, x *float32, n int)

//go:noescape
func momentumAVX2(m, c *float32, n int, beta, scale float32)

//go:noescape
func meanSquareAVX2(v, c *float32, n int, beta, w float64, sums *[4]float64)

//go:noescape
func rmsDivideAVX2(c, v *float32, n int, unbias, floor float32)

// Each wrapper checks lengths in Go (so the assembly never reads or writes
// out of bounds) and falls back to the Go loop without AVX2.

func butterfly(u, v, a, b []float32, g float32) {
	n := len(a)
	if !hasAVX2 || n == 0 {
		butterflyGo(u, v, a, b, g)
		return
	}
	_, _, _ = u[n-1], v[n-1], b[n-1]
	butterflyAVX2(&u[0], &v[0], &a[0], &b[0], n, g)
}

func unbutterfly(x, y, u, v []float32, g float32) {
	n := len(x)
	if !hasAVX2 || n == 0 {
		unbutterflyGo(x, y, u, v, g)
		return
	}
	_, _, _ = y[n-1], u[n-1], v[n-1]
	unbutterflyAVX2(&x[0], &y[0], &u[0], &v[0], n, g)
}

func add(dst, a, b []float32) {
	n := len(dst)
	if !hasAVX2 || n == 0 {
		addGo(dst, a, b)
		return
	}
	_, _ = a[n-1], b[n-1]
	addAVX2(&dst[0], &a[0], &b[0], n)
}

func axpy(dst []float32, c float32, x []float32) {
	n := len(dst)
	if !hasAVX2 || n == 0 {
		axpyGo(dst, c, x)
		return
	}
	_ = x[n-1]
	axpyAVX2(&dst[0], c, &x[0], n)
}

func momentum(m, c []float32, beta, scale float32) {
	n := len(m)
	if !hasAVX2 || n == 0 {
		momentumGo(m, c, beta, scale)
		return
	}
	_ = c[n-1]
	momentumAVX2(&m[0], &c[0], n, beta, scale)
}

// meanSquare runs the kernel on whole groups of four (one vector of
// float64s); the rest continue the same lanes in Go.
func meanSquare(v, c []float32, beta, w float64, sums *[4]float64) {
	n := len(v) &^ 3
	if !hasAVX2 || n == 0 {
		meanSquareGo(v, c, beta, w, sums)
		return
	}
	_ = c[len(v)-1]
	meanSquareAVX2(&v[0], &c[0], n, beta, w, sums)
	meanSquareGo(v[n:], c[n:], beta, w, sums)
}

func rmsDivide(c, v []float32, unbias, floor float32) {
	n := len(c)
	if !hasAVX2 || n == 0 {
		rmsDivideGo(c, v, unbias, floor)
		return
	}
	_ = v[n-1]
	rmsDivideAVX2(&c[0], &v[0], n, unbias, floor)
}

//go:noescape
func nextAboveAVX2(v *float32, n int, from int, thr uint32) int

// nextAbove returns the first i ≥ from whose magnitude bits exceed thr, or len(v).
func nextAbove(v []float32, from int, thr uint32) int {
	if !hasAVX2 || from >= len(v) {
		return nextAboveGo(v, from, thr)
	}
	return nextAboveAVX2(&v[0], len(v), from, thr)
}
