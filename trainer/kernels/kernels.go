// Package kernels owns the numerical kernels of the model and the memory
// they run on: tensors that a backend keeps (host slices on the CPU
// backends, device buffers on the GPU), the matrix products and the
// element-wise and row-wise operations of a GPT block and a Llama block,
// forward and backward. Three implementations are chosen at build time:
// pure Go (the default, no cgo), -tags openblas (OpenBLAS matrix products)
// and -tags cuda (cuBLAS and NVRTC-compiled kernels, tensors resident on
// the GPU).
//
// All values are float32, row-major. Every kernel is deterministic for a
// given backend and input.
package kernels

import "fmt"

// Tensor is a run of float32 values kept by a backend: a host slice on the
// CPU backends, a device address on the GPU. Views (Slice) share the
// memory of the tensor they were cut from. A Tensor is a small value, copied
// freely; the memory belongs to whoever allocated it (Backend.Alloc,
// Backend.Free).
type Tensor struct {
	host []float32 // the values, on host backends
	dev  uint64    // address of the first value, on device backends
	n    int
}

// Len is the number of values.
func (t Tensor) Len() int { return t.n }

// Slice is the view of values [lo, hi).
func (t Tensor) Slice(lo, hi int) Tensor {
	if lo < 0 || hi < lo || hi > t.n {
		panic(fmt.Sprintf("kernels: tensor slice [%d:%d] of %d values", lo, hi, t.n))
	}
	if t.host != nil {
		return Tensor{host: t.host[lo:hi:hi], n: hi - lo}
	}
	return Tensor{dev: t.dev + 4*uint64(lo), n: hi - lo}
}

// Host returns the values when the backend keeps them in host memory, and
// nil when they are on a device (then Backend.Download reads them).
func (t Tensor) Host() []float32 { return t.host }

// HostTensor is the tensor of a host backend over h's memory.
func HostTensor(h []float32) Tensor { return Tensor{host: h[:len(h):len(h)], n: len(h)} }

// Backend is one implementation of the kernels over its own tensors. A
// method panics on misuse (shapes that do not match the tensors), as an
// index out of range would.
type Backend interface {
	// Name says which implementation this is ("go", "openblas", "cuda").
	Name() string

	// Alloc returns n zero values.
	Alloc(n int) Tensor
	// Free gives back what Alloc returned (the tensor itself, not a view);
	// on host backends the garbage collector does it and Free does nothing.
	Free(t Tensor)
	// Upload copies src into dst (len(src) values); on a host backend a dst
	// that is src's own memory is left as it is.
	Upload(dst Tensor, src []float32)
	// Download copies len(dst) values of src into dst, after all work
	// queued before it has finished.
	Download(dst []float32, src Tensor)
	// Zero sets every value of t to 0.
	Zero(t Tensor)
	// Add writes out = a + b element-wise.
	Add(out, a, b Tensor)
	// Accumulate adds src into each of dsts (dst += src); every dst is
	// src's length.
	Accumulate(src Tensor, dsts ...Tensor)
	// AddBias adds bias (cols values) to each of rows rows of out.
	AddBias(out, bias Tensor, rows, cols int)
	// BiasBackward accumulates dBias += the sum of dOut's rows rows.
	BiasBackward(dBias, dOut Tensor, rows, cols int)
	// Embed writes (or, with add, adds) row ids[i] of table (cols wide) to
	// row i of out, for every i.
	Embed(out, table Tensor, ids []uint32, cols int, add bool)
	// EmbedBackward accumulates row i of dOut into row ids[i] of dTable,
	// rows summed in index order (so repeated ids give the same result
	// every time).
	EmbedBackward(dTable, dOut Tensor, ids []uint32, cols int)

	// Gemm computes C = alpha·op(A)·op(B) + beta·C for row-major matrices,
	// where op(X) is X or Xᵀ; op(A) is m×k, op(B) is k×n, C is m×n, and lda,
	// ldb, ldc are the row strides of A, B and C as stored.
	Gemm(transA, transB bool, m, n, k int, alpha float32, a Tensor, lda int, b Tensor, ldb int, beta float32, c Tensor, ldc int)

	// LayerNorm normalizes each of rows rows of cols values:
	// out = (in − mean)·rstd·weight + bias, and records mean and rstd (one
	// per row) for the backward pass.
	LayerNorm(out, mean, rstd, in, weight, bias Tensor, rows, cols int)
	// LayerNormBackward accumulates (+=) into dIn, dWeight and dBias.
	LayerNormBackward(dIn, dWeight, dBias, dOut, in, weight, mean, rstd Tensor, rows, cols int)

	// GELU applies the tanh approximation of GELU element-wise.
	GELU(out, in Tensor)
	// GELUBackward accumulates dIn += GELU'(in)·dOut.
	GELUBackward(dIn, in, dOut Tensor)

	// Attention is causal multi-head self-attention over qkv (b·t rows of
	// [q | k | v], each c wide, heads of c/heads). It writes out (b·t×c) and
	// the attention probabilities att (b·heads·t·t, rows beyond the causal
	// limit zero) for the backward pass.
	Attention(out, att, qkv Tensor, b, t, c, heads int)
	// AttentionBackward accumulates into dqkv; datt is scratch of att's size.
	AttentionBackward(dqkv, datt, dOut, qkv, att Tensor, b, t, c, heads int)

	// GQAttention is causal grouped-query self-attention: qkv is b·t rows of
	// [q | k | v] with heads query heads and kvHeads (dividing heads) key
	// and value heads, each hd wide, so a row is (heads+2·kvHeads)·hd wide;
	// query head h attends with key/value head h/(heads/kvHeads), as
	// Hugging Face's repeat_kv pairs them. out is b·t×heads·hd and att is
	// b·heads·t·t. Attention(c, heads) computes what GQAttention(heads,
	// heads, c/heads) does (on the CPU by other means: scalar loops there,
	// matrix products here, equal to rounding).
	GQAttention(out, att, qkv Tensor, b, t, heads, kvHeads, hd int)
	// GQAttentionBackward accumulates into dqkv; datt is scratch of att's
	// size.
	GQAttentionBackward(dqkv, datt, dOut, qkv, att Tensor, b, t, heads, kvHeads, hd int)

	// RMSNorm scales each of rows rows of cols values by the reciprocal of
	// its root mean square: out = in·rstd·weight with
	// rstd = 1/√(mean(in²) + eps), recorded per row for the backward pass.
	RMSNorm(out, rstd, in, weight Tensor, rows, cols int, eps float32)
	// RMSNormBackward accumulates (+=) into dIn and dWeight.
	RMSNormBackward(dIn, dWeight, dOut, in, weight, rstd Tensor, rows, cols int)

	// RoPE rotates, in place, the first heads·hd values of each of the b·t
	// rows of x (rows stride apart) as heads vectors of hd (even) values by
	// the rotary position embedding of the row's position (row index mod t),
	// in Hugging Face's rotate-half layout: for i < hd/2, the pair
	// (x[i], x[i+hd/2]) turns by pos·theta^(−2i/hd). With inverse set it
	// turns the other way, which is the backward pass (the rotation's
	// transpose).
	RoPE(x Tensor, b, t, stride, heads, hd int, theta float32, inverse bool)

	// SwiGLU computes out = silu(gate)·up for rows rows whose input row is
	// [gate (n values) | up (n values)], silu(g) = g·sigmoid(g).
	SwiGLU(out, gateUp Tensor, rows, n int)
	// SwiGLUBackward accumulates into dGateUp.
	SwiGLUBackward(dGateUp, gateUp, dOut Tensor, rows, n int)

	// SoftmaxCrossEntropy turns logits (rows×vocab) into probabilities
	// (in place) and writes each row's loss −log p[target].
	SoftmaxCrossEntropy(losses, logits Tensor, targets []uint32, rows, vocab int)
	// CrossEntropyBackward writes dLogits = (probs − onehot(target))·scale,
	// where probs is what SoftmaxCrossEntropy left in logits.
	CrossEntropyBackward(dLogits, probs Tensor, targets []uint32, rows, vocab int, scale float32)
}

// Default returns the backend this binary was built with.
func Default() Backend { return defaultBackend() }

// Precision is the arithmetic of a backend's matrix products. Tensors are
// float32 whatever it is (the master weights, the optimizer's state and
// everything between the products).
type Precision string

const (
	// FP32 multiplies and sums in float32.
	FP32 Precision = "fp32"
	// BF16 rounds the products' inputs to bfloat16 and sums in float32:
	// the GPU's tensor cores run it many times faster than float32.
	BF16 Precision = "bf16"
)

// ParsePrecision reads "fp32" or "bf16"; "" is fp32.
func ParsePrecision(s string) (Precision, error) {
	switch Precision(s) {
	case "", FP32:
		return FP32, nil
	case BF16:
		return BF16, nil
	}
	return "", fmt.Errorf("kernels: precision %q: want \"fp32\" or \"bf16\"", s)
}

// precisioned is a backend that can compute its products at another
// precision.
type precisioned interface {
	Precision() Precision
	withPrecision(p Precision) Backend
}

// WithPrecision returns be with its matrix products at p where be can do
// so, and the precision the returned backend computes at: the CPU backends
// compute in float32 only (bf16 would be slower there, not faster), so they
// return themselves and FP32.
func WithPrecision(be Backend, p Precision) (Backend, Precision) {
	if pb, ok := be.(precisioned); ok {
		b := pb.withPrecision(p)
		return b, b.(precisioned).Precision()
	}
	return be, FP32
}

// PrecisionOf is the precision be's matrix products compute at.
func PrecisionOf(be Backend) Precision {
	if pb, ok := be.(precisioned); ok {
		return pb.Precision()
	}
	return FP32
}

// DeviceMemory reports the free and total memory of be's device in bytes;
// ok is false for a backend whose tensors are in host memory.
func DeviceMemory(be Backend) (free, total int64, ok bool) {
	if m, is := be.(interface{ Memory() (int64, int64) }); is {
		free, total = m.Memory()
		return free, total, true
	}
	return 0, 0, false
}

// Pin asks be to page-lock h, a long-lived host buffer that Upload and
// Download will move often, for faster transfers; it does nothing on a
// backend that has no use for it. An error means h works as before, only
// slower to move.
func Pin(be Backend, h []float32) error {
	if p, ok := be.(interface{ Pin([]float32) error }); ok {
		return p.Pin(h)
	}
	return nil
}

// Describe says in one line what be computes on: its name, device, the
// precision of its products and the device's free memory.
func Describe(be Backend) string {
	s := be.Name()
	if d, ok := be.(interface{ Device() string }); ok {
		s += " on " + d.Device()
	}
	s += ", " + string(PrecisionOf(be)) + " products"
	if free, total, ok := DeviceMemory(be); ok {
		s += fmt.Sprintf(", %.1f of %.1f GiB free", float64(free)/(1<<30), float64(total)/(1<<30))
	}
	return s
}
