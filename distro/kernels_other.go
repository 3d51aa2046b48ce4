//go:build !amd64 || purego

package distro

func butterfly(u, v, a, b []float32, g float32)    { butterflyGo(u, v, a, b, g) }
func unbutterfly(x, y, u, v []float32, g float32)  { unbutterflyGo(x, y, u, v, g) }
func add(dst, a, b []float32)                      { addGo(dst, a, b) }
func axpy(dst []float32, c float32, x []float32)   { axpyGo(dst, c, x) }
func momentum(m, c []float32, beta, scale float32) { momentumGo(m, c, beta, scale) }

func meanSquare(v, c []float32, beta, w float64, sums *[4]float64) {
	meanSquareGo(v, c, beta, w, sums)
}
func rmsDivide(c, v []float32, unbias, floor float32) { rmsDivideGo(c, v, unbias, floor) }

func nextAbove(v []float32, from int, thr uint32) int { return nextAboveGo(v, from, thr) }

const (
	vectorKernels = false
	hasAVX2       = false
)
