// Package kernels owns the numerical kernels of the model: matrix products
// and the element-wise and row-wise operations of a GPT block and a Llama
// block, forward and backward, behind one interface with three implementations chosen at build
// time: pure Go (the default, no cgo), -tags openblas (OpenBLAS matrix
// products) and -tags cuda (cuBLAS and NVRTC-compiled kernels).
//
// All tensors are float32, row-major, in host memory. Every kernel is
// deterministic for a given backend and input.
package kernels

// Backend is one implementation of the kernels.
type Backend interface {
	// Name says which implementation this is ("go", "openblas", "cuda").
	Name() string

	// Gemm computes C = alpha·op(A)·op(B) + beta·C for row-major matrices,
	// where op(X) is X or Xᵀ; op(A) is m×k, op(B) is k×n, C is m×n, and lda,
	// ldb, ldc are the row strides of A, B and C as stored.
	Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

	// LayerNorm normalizes each of rows rows of cols values:
	// out = (in − mean)·rstd·weight + bias, and records mean and rstd (one
	// per row) for the backward pass.
	LayerNorm(out, mean, rstd, in, weight, bias []float32, rows, cols int)
	// LayerNormBackward accumulates (+=) into dIn, dWeight and dBias.
	LayerNormBackward(dIn, dWeight, dBias, dOut, in, weight, mean, rstd []float32, rows, cols int)

	// GELU applies the tanh approximation of GELU element-wise.
	GELU(out, in []float32)
	// GELUBackward accumulates dIn += GELU'(in)·dOut.
	GELUBackward(dIn, in, dOut []float32)

	// Attention is causal multi-head self-attention over qkv (b·t rows of
	// [q | k | v], each c wide, heads of c/heads). It writes out (b·t×c) and
	// the attention probabilities att (b·heads·t·t, rows beyond the causal
	// limit zero) for the backward pass.
	Attention(out, att, qkv []float32, b, t, c, heads int)
	// AttentionBackward accumulates into dqkv; datt is scratch of att's size.
	AttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, c, heads int)

	// GQAttention is causal grouped-query self-attention: qkv is b·t rows of
	// [q | k | v] with heads query heads and kvHeads (dividing heads) key
	// and value heads, each hd wide, so a row is (heads+2·kvHeads)·hd wide;
	// query head h attends with key/value head h/(heads/kvHeads), as
	// Hugging Face's repeat_kv pairs them. out is b·t×heads·hd and att is
	// b·heads·t·t. Attention(c, heads) computes what GQAttention(heads,
	// heads, c/heads) does (on the CPU by other means: scalar loops there,
	// matrix products here, equal to rounding).
	GQAttention(out, att, qkv []float32, b, t, heads, kvHeads, hd int)
	// GQAttentionBackward accumulates into dqkv; datt is scratch of att's
	// size.
	GQAttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int)

	// RMSNorm scales each of rows rows of cols values by the reciprocal of
	// its root mean square: out = in·rstd·weight with
	// rstd = 1/√(mean(in²) + eps), recorded per row for the backward pass.
	RMSNorm(out, rstd, in, weight []float32, rows, cols int, eps float32)
	// RMSNormBackward accumulates (+=) into dIn and dWeight.
	RMSNormBackward(dIn, dWeight, dOut, in, weight, rstd []float32, rows, cols int)

	// RoPE rotates, in place, the first heads·hd values of each of the b·t
	// rows of x (rows stride apart) as heads vectors of hd (even) values by
	// the rotary position embedding of the row's position (row index mod t),
	// in Hugging Face's rotate-half layout: for i < hd/2, the pair
	// (x[i], x[i+hd/2]) turns by pos·theta^(−2i/hd). With inverse set it
	// turns the other way, which is the backward pass (the rotation's
	// transpose).
	RoPE(x []float32, b, t, stride, heads, hd int, theta float32, inverse bool)

	// SwiGLU computes out = silu(gate)·up for rows rows whose input row is
	// [gate (n values) | up (n values)], silu(g) = g·sigmoid(g).
	SwiGLU(out, gateUp []float32, rows, n int)
	// SwiGLUBackward accumulates into dGateUp.
	SwiGLUBackward(dGateUp, gateUp, dOut []float32, rows, n int)

	// SoftmaxCrossEntropy turns logits (rows×vocab) into probabilities
	// (in place) and writes each row's loss −log p[target].
	SoftmaxCrossEntropy(losses, logits []float32, targets []uint32, rows, vocab int)
	// CrossEntropyBackward writes dLogits = (probs − onehot(target))·scale,
	// where probs is what SoftmaxCrossEntropy left in logits.
	CrossEntropyBackward(dLogits, probs []float32, targets []uint32, rows, vocab int, scale float32)
}

// Default returns the backend this binary was built with.
func Default() Backend { return defaultBackend() }
