package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas/gonum"
)

// TestTiledGemmMatchesGonum checks the WebAssembly product against gonum's
// on every transpose, shapes that do and do not divide into tiles and
// column blocks, strides wider than the matrices, alpha and beta (beta = 0
// must overwrite a NaN).
func TestTiledGemmMatchesGonum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		return x
	}
	for _, tc := range []struct{ m, n, k int }{{1, 1, 1}, {4, 4, 4}, {5, 7, 3}, {17, 33, 9}, {64, 260, 300}, {3, 9000, 2}, {8, 8, 0}} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			for _, ab := range [][2]float32{{1, 0}, {0.5, 1}, {-2, 0.25}, {0, 0.5}} {
				name := fmt.Sprintf("%dx%dx%d/transA=%v/transB=%v/alpha=%v/beta=%v", tc.m, tc.n, tc.k, tr[0], tr[1], ab[0], ab[1])
				t.Run(name, func(t *testing.T) {
					ra, ca := tc.m, tc.k
					if tr[0] {
						ra, ca = tc.k, tc.m
					}
					rb, cb := tc.k, tc.n
					if tr[1] {
						rb, cb = tc.n, tc.k
					}
					lda, ldb, ldc := ca+3, cb+1, tc.n+2
					a, b := fill(max(1, ra*lda)), fill(max(1, rb*ldb))
					want := fill(tc.m * ldc)
					if ab[1] == 0 {
						want[0] = float32(math.NaN())
					}
					got := append([]float32(nil), want...)
					gonum.Implementation{}.Sgemm(transpose(tr[0]), transpose(tr[1]), tc.m, tc.n, tc.k, ab[0], a, lda, b, ldb, ab[1], want, ldc)
					tiledGemm(tr[0], tr[1], tc.m, tc.n, tc.k, ab[0], a, lda, b, ldb, ab[1], got, ldc)
					for i := range want {
						if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-4*(1+math.Abs(float64(want[i])))) {
							t.Fatalf("C[%d] = %v, gonum %v", i, got[i], want[i])
						}
					}
				})
			}
		}
	}
}
