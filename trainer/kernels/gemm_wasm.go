//go:build wasm

package kernels

// gemm is Go.Gemm's product: on WebAssembly gonum has neither assembly nor
// threads, and tiledGemm's register tiles are the faster loops.
func gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	tiledGemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// softmaxExp is eˣ for the softmaxes: exp32, several times faster than
// math.Exp on WebAssembly.
func softmaxExp(x float32) float64 { return float64(exp32(x)) }
