//go:build !wasm

package kernels

import (
	"math"

	"gonum.org/v1/gonum/blas/gonum"
)

// gemm is Go.Gemm's product: gonum's, with its assembly and its threads.
func gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gonum.Implementation{}.Sgemm(transpose(transA), transpose(transB), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// softmaxExp is eˣ for the softmaxes: math.Exp (assembly here), in float64
// as the softmaxes have always summed it.
func softmaxExp(x float32) float64 { return math.Exp(float64(x)) }
