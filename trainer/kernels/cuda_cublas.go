//go:build cuda

package kernels

/*
#cgo LDFLAGS: -lcublas
#include <cublas_v2.h>

// psyche_gemm is cublasGemmEx on float32 operands in device memory with
// alpha and beta from the host; compute picks the arithmetic
// (CUBLAS_COMPUTE_32F: float32 throughout; CUBLAS_COMPUTE_32F_FAST_16BF:
// inputs rounded to bfloat16 on the tensor cores, products summed in
// float32).
static int psyche_gemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, float alpha,
		unsigned long long a, int lda, unsigned long long b, int ldb, float beta,
		unsigned long long c, int ldc, int compute) {
	return (int)cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
		&alpha, (const void*)a, CUDA_R_32F, lda, (const void*)b, CUDA_R_32F, ldb,
		&beta, (void*)c, CUDA_R_32F, ldc, (cublasComputeType_t)compute, CUBLAS_GEMM_DEFAULT);
}

// psyche_gemm_batched is psyche_gemm over count products whose operands
// start stride values apart.
static int psyche_gemm_batched(cublasHandle_t h, int ta, int tb, int m, int n, int k, float alpha,
		unsigned long long a, int lda, long long sa, unsigned long long b, int ldb, long long sb, float beta,
		unsigned long long c, int ldc, long long sc, int count, int compute) {
	return (int)cublasGemmStridedBatchedEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
		&alpha, (const void*)a, CUDA_R_32F, lda, sa, (const void*)b, CUDA_R_32F, ldb, sb,
		&beta, (void*)c, CUDA_R_32F, ldc, sc, count, (cublasComputeType_t)compute, CUBLAS_GEMM_DEFAULT);
}

static int psyche_cublas_create(cublasHandle_t* h) { return (int)cublasCreate(h); }
static int psyche_cublas_destroy(cublasHandle_t h) { return (int)cublasDestroy(h); }
*/
import "C"

import "fmt"

// This file is the one that calls cuBLAS, directly through cgo: cublasGemmEx
// is what gives a choice of arithmetic (float32 or bfloat16 tensor cores)
// over the same float32 tensors.

// cublasCompute is a cublasComputeType_t.
type cublasCompute int

const (
	computeFP32 cublasCompute = C.CUBLAS_COMPUTE_32F
	computeBF16 cublasCompute = C.CUBLAS_COMPUTE_32F_FAST_16BF
)

type cublasHandle struct{ h C.cublasHandle_t }

// newCublas creates a handle on the context current on the calling thread;
// its work goes to the legacy default stream, as the kernels' launches do,
// so the two are ordered.
func newCublas() (*cublasHandle, error) {
	var h C.cublasHandle_t
	if st := C.psyche_cublas_create(&h); st != 0 {
		return nil, fmt.Errorf("creating the cuBLAS handle: cublasStatus %d", int(st))
	}
	return &cublasHandle{h: h}, nil
}

func (b *cublasHandle) close() {
	if b != nil {
		C.psyche_cublas_destroy(b.h)
	}
}

// gemm is cublasGemmEx, column-major, on device operands.
func (b *cublasHandle) gemm(transA, transB bool, m, n, k int, alpha float32, a devPtr, lda int, bm devPtr, ldb int, beta float32, c devPtr, ldc int, compute cublasCompute) error {
	flag := func(t bool) C.int {
		if t {
			return 1
		}
		return 0
	}
	st := C.psyche_gemm(b.h, flag(transA), flag(transB), C.int(m), C.int(n), C.int(k), C.float(alpha),
		C.ulonglong(a), C.int(lda), C.ulonglong(bm), C.int(ldb), C.float(beta), C.ulonglong(c), C.int(ldc), C.int(compute))
	if st != 0 {
		return fmt.Errorf("cublasGemmEx: cublasStatus %d", int(st))
	}
	return nil
}

// strided is one operand of a batched product on the device: its first
// matrix, its row stride (row-major) and the distance in values from one
// matrix to the next.
type strided struct {
	p      devPtr
	ld     int
	stride int64
}

// gemmBatched computes, for i < count, the row-major
// C_i = alpha·op(A_i)·op(B_i) + beta·C_i (op(A) m×k, op(B) k×n), as Gemm
// turns row-major into cuBLAS's column-major: operands and m, n swapped.
func (b *cublasHandle) gemmBatched(transA, transB bool, m, n, k int, alpha float32, a, bm strided, beta float32, c strided, count int, compute cublasCompute) error {
	flag := func(t bool) C.int {
		if t {
			return 1
		}
		return 0
	}
	st := C.psyche_gemm_batched(b.h, flag(transB), flag(transA), C.int(n), C.int(m), C.int(k), C.float(alpha),
		C.ulonglong(bm.p), C.int(bm.ld), C.longlong(bm.stride), C.ulonglong(a.p), C.int(a.ld), C.longlong(a.stride),
		C.float(beta), C.ulonglong(c.p), C.int(c.ld), C.longlong(c.stride), C.int(count), C.int(compute))
	if st != 0 {
		return fmt.Errorf("cublasGemmStridedBatchedEx: cublasStatus %d", int(st))
	}
	return nil
}
