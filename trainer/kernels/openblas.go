//go:build openblas && !cuda

package kernels

// #cgo LDFLAGS: -lopenblas
import "C"

import (
	"gonum.org/v1/netlib/blas/netlib"
)

// OpenBLAS is the Go backend with its matrix products done by OpenBLAS
// (Debian libopenblas-dev) through gonum's cgo BLAS bindings.
type OpenBLAS struct{ Go }

// Name implements Host.
func (OpenBLAS) Name() string { return "openblas" }

// Gemm implements Host with cblas_sgemm.
func (OpenBLAS) Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	netlib.Implementation{}.Sgemm(transpose(transA), transpose(transB), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// GQAttention implements Host with OpenBLAS's matrix products (the
// embedded Go backend's would use gonum's).
func (be OpenBLAS) GQAttention(out, att, qkv []float32, b, t, heads, kvHeads, hd int) {
	gqAttentionGemm(be.Gemm, out, att, qkv, b, t, heads, kvHeads, hd)
}

// GQAttentionBackward implements Host with OpenBLAS's matrix products.
func (be OpenBLAS) GQAttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int) {
	gqAttentionBackwardGemm(be.Gemm, dqkv, datt, dOut, qkv, att, b, t, heads, kvHeads, hd)
}

func defaultBackend() Backend { return OnHost(OpenBLAS{}) }
