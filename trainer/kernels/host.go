package kernels

import "fmt"

// Host is the form of the kernels that the CPU backends (Go, OpenBLAS)
// implement: the operations of Backend over host slices. OnHost turns one
// into a Backend; Slices turns any Backend into one (copying through the
// device where the backend keeps its tensors there), which is how the
// kernel tests drive every backend through the same tables.
type Host interface {
	Name() string
	Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
	LayerNorm(out, mean, rstd, in, weight, bias []float32, rows, cols int)
	LayerNormBackward(dIn, dWeight, dBias, dOut, in, weight, mean, rstd []float32, rows, cols int)
	GELU(out, in []float32)
	GELUBackward(dIn, in, dOut []float32)
	Attention(out, att, qkv []float32, b, t, c, heads int)
	AttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, c, heads int)
	GQAttention(out, att, qkv []float32, b, t, heads, kvHeads, hd int)
	GQAttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int)
	RMSNorm(out, rstd, in, weight []float32, rows, cols int, eps float32)
	RMSNormBackward(dIn, dWeight, dOut, in, weight, rstd []float32, rows, cols int)
	RoPE(x []float32, b, t, stride, heads, hd int, theta float32, inverse bool)
	SwiGLU(out, gateUp []float32, rows, n int)
	SwiGLUBackward(dGateUp, gateUp, dOut []float32, rows, n int)
	SoftmaxCrossEntropy(losses, logits []float32, targets []uint32, rows, vocab int)
	CrossEntropyBackward(dLogits, probs []float32, targets []uint32, rows, vocab int, scale float32)
}

var (
	_ Host = Go{}
	_ Host = viaDevice{}
)

// OnHost is the Backend whose tensors are host slices and whose kernels
// are h's.
func OnHost(h Host) Backend { return onHost{h} }

// InHostMemory says whether be keeps its tensors in host memory, so that a
// tensor over a host slice (HostTensor) is the slice itself and nothing
// needs copying.
func InHostMemory(be Backend) bool {
	_, ok := be.(onHost)
	return ok
}

type onHost struct{ h Host }

func (o onHost) Name() string { return o.h.Name() }

func (onHost) Alloc(n int) Tensor {
	if n < 0 {
		panic(fmt.Sprintf("kernels: alloc of %d values", n))
	}
	return HostTensor(make([]float32, n))
}

func (onHost) Free(Tensor) {}

func sameMemory(a, b []float32) bool { return len(a) > 0 && len(b) > 0 && &a[0] == &b[0] }

func (onHost) Upload(dst Tensor, src []float32) {
	if !sameMemory(dst.host, src) {
		copy(dst.host[:len(src)], src)
	}
}

func (onHost) Download(dst []float32, src Tensor) {
	if !sameMemory(dst, src.host) {
		copy(dst, src.host[:len(dst)])
	}
}

func (onHost) Zero(t Tensor) { clear(t.host) }

func (onHost) Add(out, a, b Tensor) {
	o, x, y := out.host, a.host[:out.n], b.host[:out.n]
	for i := range o {
		o[i] = x[i] + y[i]
	}
}

func (onHost) Accumulate(src Tensor, dsts ...Tensor) {
	for _, d := range dsts {
		if d.n != src.n {
			panic(fmt.Sprintf("kernels: accumulating %d values into %d", src.n, d.n))
		}
	}
	// One pass over src feeds every destination: the residual stream's
	// gradient goes to two places at once.
	switch len(dsts) {
	case 1:
		d := dsts[0].host
		for i, v := range src.host {
			d[i] += v
		}
	case 2:
		d0, d1 := dsts[0].host, dsts[1].host
		for i, v := range src.host {
			d0[i] += v
			d1[i] += v
		}
	default:
		for _, d := range dsts {
			dh := d.host
			for i, v := range src.host {
				dh[i] += v
			}
		}
	}
}

func (onHost) AddBias(out, bias Tensor, rows, cols int) {
	b := bias.host[:cols]
	for r := 0; r < rows; r++ {
		row := out.host[r*cols : (r+1)*cols]
		for i := range row {
			row[i] += b[i]
		}
	}
}

func (onHost) BiasBackward(dBias, dOut Tensor, rows, cols int) {
	db := dBias.host[:cols]
	for r := 0; r < rows; r++ {
		for i, v := range dOut.host[r*cols : (r+1)*cols] {
			db[i] += v
		}
	}
}

func (onHost) Embed(out, table Tensor, ids []uint32, cols int, add bool) {
	for i, id := range ids {
		row, src := out.host[i*cols:(i+1)*cols], table.host[int(id)*cols:(int(id)+1)*cols]
		if add {
			for j, v := range src {
				row[j] += v
			}
		} else {
			copy(row, src)
		}
	}
}

func (onHost) EmbedBackward(dTable, dOut Tensor, ids []uint32, cols int) {
	for i, id := range ids {
		row, dst := dOut.host[i*cols:(i+1)*cols], dTable.host[int(id)*cols:(int(id)+1)*cols]
		for j, v := range row {
			dst[j] += v
		}
	}
}

func (o onHost) Gemm(transA, transB bool, m, n, k int, alpha float32, a Tensor, lda int, b Tensor, ldb int, beta float32, c Tensor, ldc int) {
	o.h.Gemm(transA, transB, m, n, k, alpha, a.host, lda, b.host, ldb, beta, c.host, ldc)
}

func (o onHost) LayerNorm(out, mean, rstd, in, weight, bias Tensor, rows, cols int) {
	o.h.LayerNorm(out.host, mean.host, rstd.host, in.host, weight.host, bias.host, rows, cols)
}

func (o onHost) LayerNormBackward(dIn, dWeight, dBias, dOut, in, weight, mean, rstd Tensor, rows, cols int) {
	o.h.LayerNormBackward(dIn.host, dWeight.host, dBias.host, dOut.host, in.host, weight.host, mean.host, rstd.host, rows, cols)
}

func (o onHost) GELU(out, in Tensor) { o.h.GELU(out.host, in.host) }

func (o onHost) GELUBackward(dIn, in, dOut Tensor) { o.h.GELUBackward(dIn.host, in.host, dOut.host) }

func (o onHost) Attention(out, att, qkv Tensor, b, t, c, heads int) {
	o.h.Attention(out.host, att.host, qkv.host, b, t, c, heads)
}

func (o onHost) AttentionBackward(dqkv, datt, dOut, qkv, att Tensor, b, t, c, heads int) {
	o.h.AttentionBackward(dqkv.host, datt.host, dOut.host, qkv.host, att.host, b, t, c, heads)
}

func (o onHost) GQAttention(out, att, qkv Tensor, b, t, heads, kvHeads, hd int) {
	o.h.GQAttention(out.host, att.host, qkv.host, b, t, heads, kvHeads, hd)
}

func (o onHost) GQAttentionBackward(dqkv, datt, dOut, qkv, att Tensor, b, t, heads, kvHeads, hd int) {
	o.h.GQAttentionBackward(dqkv.host, datt.host, dOut.host, qkv.host, att.host, b, t, heads, kvHeads, hd)
}

func (o onHost) RMSNorm(out, rstd, in, weight Tensor, rows, cols int, eps float32) {
	o.h.RMSNorm(out.host, rstd.host, in.host, weight.host, rows, cols, eps)
}

func (o onHost) RMSNormBackward(dIn, dWeight, dOut, in, weight, rstd Tensor, rows, cols int) {
	o.h.RMSNormBackward(dIn.host, dWeight.host, dOut.host, in.host, weight.host, rstd.host, rows, cols)
}

func (o onHost) RoPE(x Tensor, b, t, stride, heads, hd int, theta float32, inverse bool) {
	o.h.RoPE(x.host, b, t, stride, heads, hd, theta, inverse)
}

func (o onHost) SwiGLU(out, gateUp Tensor, rows, n int) { o.h.SwiGLU(out.host, gateUp.host, rows, n) }

func (o onHost) SwiGLUBackward(dGateUp, gateUp, dOut Tensor, rows, n int) {
	o.h.SwiGLUBackward(dGateUp.host, gateUp.host, dOut.host, rows, n)
}

func (o onHost) SoftmaxCrossEntropy(losses, logits Tensor, targets []uint32, rows, vocab int) {
	o.h.SoftmaxCrossEntropy(losses.host, logits.host, targets, rows, vocab)
}

func (o onHost) CrossEntropyBackward(dLogits, probs Tensor, targets []uint32, rows, vocab int, scale float32) {
	o.h.CrossEntropyBackward(dLogits.host, probs.host, targets, rows, vocab, scale)
}

// Slices is be's kernels over host slices: on a host backend its own
// kernels; on a device backend each call uploads its slices into fresh
// tensors, runs, downloads what the operation writes and frees them. For
// tests and measurements of single kernels, not for training (a model keeps
// its tensors on the backend).
func Slices(be Backend) Host {
	if o, ok := be.(onHost); ok {
		return o.h
	}
	return viaDevice{be}
}

type viaDevice struct{ be Backend }

func (s viaDevice) Name() string { return s.be.Name() }

// call uploads ins, runs fn on the tensors, downloads outs (indexes into
// ins that the operation writes) and frees the tensors.
func (s viaDevice) call(fn func(ts []Tensor), outs []int, ins ...[]float32) {
	ts := make([]Tensor, len(ins))
	for i, h := range ins {
		ts[i] = s.be.Alloc(len(h))
		s.be.Upload(ts[i], h)
	}
	defer func() {
		for _, t := range ts {
			s.be.Free(t)
		}
	}()
	fn(ts)
	for _, i := range outs {
		s.be.Download(ins[i], ts[i])
	}
}

func (s viaDevice) Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	s.call(func(t []Tensor) { s.be.Gemm(transA, transB, m, n, k, alpha, t[0], lda, t[1], ldb, beta, t[2], ldc) }, []int{2}, a, b, c)
}

func (s viaDevice) LayerNorm(out, mean, rstd, in, weight, bias []float32, rows, cols int) {
	s.call(func(t []Tensor) { s.be.LayerNorm(t[0], t[1], t[2], t[3], t[4], t[5], rows, cols) }, []int{0, 1, 2}, out, mean, rstd, in, weight, bias)
}

func (s viaDevice) LayerNormBackward(dIn, dWeight, dBias, dOut, in, weight, mean, rstd []float32, rows, cols int) {
	s.call(func(t []Tensor) { s.be.LayerNormBackward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], rows, cols) },
		[]int{0, 1, 2}, dIn, dWeight, dBias, dOut, in, weight, mean, rstd)
}

func (s viaDevice) GELU(out, in []float32) {
	s.call(func(t []Tensor) { s.be.GELU(t[0], t[1]) }, []int{0}, out, in)
}

func (s viaDevice) GELUBackward(dIn, in, dOut []float32) {
	s.call(func(t []Tensor) { s.be.GELUBackward(t[0], t[1], t[2]) }, []int{0}, dIn, in, dOut)
}

func (s viaDevice) Attention(out, att, qkv []float32, b, t, c, heads int) {
	s.call(func(x []Tensor) { s.be.Attention(x[0], x[1], x[2], b, t, c, heads) }, []int{0, 1}, out, att, qkv)
}

func (s viaDevice) AttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, c, heads int) {
	s.call(func(x []Tensor) { s.be.AttentionBackward(x[0], x[1], x[2], x[3], x[4], b, t, c, heads) }, []int{0}, dqkv, datt, dOut, qkv, att)
}

func (s viaDevice) GQAttention(out, att, qkv []float32, b, t, heads, kvHeads, hd int) {
	s.call(func(x []Tensor) { s.be.GQAttention(x[0], x[1], x[2], b, t, heads, kvHeads, hd) }, []int{0, 1}, out, att, qkv)
}

func (s viaDevice) GQAttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int) {
	s.call(func(x []Tensor) { s.be.GQAttentionBackward(x[0], x[1], x[2], x[3], x[4], b, t, heads, kvHeads, hd) },
		[]int{0}, dqkv, datt, dOut, qkv, att)
}

func (s viaDevice) RMSNorm(out, rstd, in, weight []float32, rows, cols int, eps float32) {
	s.call(func(t []Tensor) { s.be.RMSNorm(t[0], t[1], t[2], t[3], rows, cols, eps) }, []int{0, 1}, out, rstd, in, weight)
}

func (s viaDevice) RMSNormBackward(dIn, dWeight, dOut, in, weight, rstd []float32, rows, cols int) {
	s.call(func(t []Tensor) { s.be.RMSNormBackward(t[0], t[1], t[2], t[3], t[4], t[5], rows, cols) }, []int{0, 1},
		dIn, dWeight, dOut, in, weight, rstd)
}

func (s viaDevice) RoPE(x []float32, b, t, stride, heads, hd int, theta float32, inverse bool) {
	s.call(func(ts []Tensor) { s.be.RoPE(ts[0], b, t, stride, heads, hd, theta, inverse) }, []int{0}, x)
}

func (s viaDevice) SwiGLU(out, gateUp []float32, rows, n int) {
	s.call(func(t []Tensor) { s.be.SwiGLU(t[0], t[1], rows, n) }, []int{0}, out, gateUp)
}

func (s viaDevice) SwiGLUBackward(dGateUp, gateUp, dOut []float32, rows, n int) {
	s.call(func(t []Tensor) { s.be.SwiGLUBackward(t[0], t[1], t[2], rows, n) }, []int{0}, dGateUp, gateUp, dOut)
}

func (s viaDevice) SoftmaxCrossEntropy(losses, logits []float32, targets []uint32, rows, vocab int) {
	s.call(func(t []Tensor) { s.be.SoftmaxCrossEntropy(t[0], t[1], targets, rows, vocab) }, []int{0, 1}, losses, logits)
}

func (s viaDevice) CrossEntropyBackward(dLogits, probs []float32, targets []uint32, rows, vocab int, scale float32) {
	s.call(func(t []Tensor) { s.be.CrossEntropyBackward(t[0], t[1], targets, rows, vocab, scale) }, []int{0}, dLogits, probs)
}

// Apart is h's kernels over tensors in memory of their own, apart from
// the slices a model hands over: a host stand-in for a device backend, so
// that the CPU tests run the copies a model makes to and from a GPU
// (InHostMemory is false for it) and can compare them bit for bit with h.
func Apart(h Host) Backend { return apart{onHost{h}} }

type apart struct{ onHost }

func (a apart) Name() string { return a.h.Name() + "-apart" }

func (apart) Upload(dst Tensor, src []float32) { copy(dst.host[:len(src)], src) }

func (apart) Download(dst []float32, src Tensor) { copy(dst, src.host[:len(dst)]) }
