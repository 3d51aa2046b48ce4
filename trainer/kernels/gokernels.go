package kernels

import (
	"math"
	"runtime"
	"sync"

	"gonum.org/v1/gonum/blas"
)

// Go is the pure-Go backend: gonum's parallel Sgemm and the kernels below,
// parallel over rows (or attention heads) with goroutines.
type Go struct{}

// Name implements Host.
func (Go) Name() string { return "go" }

func transpose(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

// Gemm implements Host with gonum's pure-Go BLAS (tiledGemm on
// WebAssembly).
func (Go) Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// chunkRows is the grain of row parallelism. Reductions across rows are
// summed chunk by chunk in chunk order, so results do not depend on the
// number of cores.
const chunkRows = 16

// parallel runs fn on [0, n) in chunks of grain, spread over the cores.
func parallel(n, grain int, fn func(lo, hi int)) {
	chunks := (n + grain - 1) / grain
	workers := min(runtime.GOMAXPROCS(0), chunks)
	if workers <= 1 {
		for lo := 0; lo < n; lo += grain {
			fn(lo, min(lo+grain, n))
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan int, chunks)
	for c := 0; c < chunks; c++ {
		next <- c
	}
	close(next)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				fn(c*grain, min((c+1)*grain, n))
			}
		}()
	}
	wg.Wait()
}

// LayerNormEps is LayerNorm's ε, fixed: GPT-2's, and what every backend and
// the PyTorch worker's GPT use.
const LayerNormEps = 1e-5

// LayerNorm implements Host.
func (Go) LayerNorm(out, mean, rstd, in, weight, bias []float32, rows, cols int) {
	parallel(rows, chunkRows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			x := in[r*cols : (r+1)*cols]
			var m float64
			for _, v := range x {
				m += float64(v)
			}
			m /= float64(cols)
			var variance float64
			for _, v := range x {
				d := float64(v) - m
				variance += d * d
			}
			variance /= float64(cols)
			s := 1 / math.Sqrt(variance+LayerNormEps)
			o := out[r*cols : (r+1)*cols]
			for i, v := range x {
				o[i] = float32((float64(v)-m)*s)*weight[i] + bias[i]
			}
			mean[r], rstd[r] = float32(m), float32(s)
		}
	})
}

// LayerNormBackward implements Host.
func (Go) LayerNormBackward(dIn, dWeight, dBias, dOut, in, weight, mean, rstd []float32, rows, cols int) {
	chunks := (rows + chunkRows - 1) / chunkRows
	dw := make([]float32, chunks*cols)
	db := make([]float32, chunks*cols)
	parallel(rows, chunkRows, func(lo, hi int) {
		c := lo / chunkRows
		pw, pb := dw[c*cols:(c+1)*cols], db[c*cols:(c+1)*cols]
		for r := lo; r < hi; r++ {
			x, dy, dx := in[r*cols:(r+1)*cols], dOut[r*cols:(r+1)*cols], dIn[r*cols:(r+1)*cols]
			m, s := mean[r], rstd[r]
			var dnormMean, dnormNormMean float32
			for i := range x {
				norm := (x[i] - m) * s
				dnorm := weight[i] * dy[i]
				dnormMean += dnorm
				dnormNormMean += dnorm * norm
			}
			dnormMean /= float32(cols)
			dnormNormMean /= float32(cols)
			for i := range x {
				norm := (x[i] - m) * s
				dnorm := weight[i] * dy[i]
				pb[i] += dy[i]
				pw[i] += norm * dy[i]
				dx[i] += (dnorm - dnormMean - norm*dnormNormMean) * s
			}
		}
	})
	for c := 0; c < chunks; c++ {
		for i := 0; i < cols; i++ {
			dWeight[i] += dw[c*cols+i]
			dBias[i] += db[c*cols+i]
		}
	}
}

var geluScale = float32(math.Sqrt(2 / math.Pi))

// GELU implements Host.
func (Go) GELU(out, in []float32) {
	parallel(len(in), 4096, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := in[i]
			out[i] = 0.5 * x * (1 + tanh32(geluScale*(x+0.044715*x*x*x)))
		}
	})
}

// GELUBackward implements Host.
func (Go) GELUBackward(dIn, in, dOut []float32) {
	parallel(len(in), 4096, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := in[i]
			u := geluScale * (x + 0.044715*x*x*x)
			th := tanh32(u)
			sech2 := 1 - th*th
			grad := 0.5*(1+th) + 0.5*x*sech2*geluScale*(1+3*0.044715*x*x)
			dIn[i] += grad * dOut[i]
		}
	})
}

func tanh32(x float32) float32 { return float32(math.Tanh(float64(x))) }

// Attention implements Host: multi-head attention is grouped-query
// attention with one query head per key/value head, here computed by the
// scalar loops (gqAttentionLoops) that GPT has always used, so its results
// stay what they were bit for bit.
func (Go) Attention(out, att, qkv []float32, b, t, c, heads int) {
	gqAttentionLoops(out, att, qkv, b, t, heads, heads, c/heads)
}

// AttentionBackward implements Host.
func (Go) AttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, c, heads int) {
	gqAttentionBackwardLoops(dqkv, datt, dOut, qkv, att, b, t, heads, heads, c/heads)
}

// GQAttention implements Host with matrix products (gqAttentionGemm).
func (be Go) GQAttention(out, att, qkv []float32, b, t, heads, kvHeads, hd int) {
	gqAttentionGemm(be.Gemm, out, att, qkv, b, t, heads, kvHeads, hd)
}

// GQAttentionBackward implements Host with matrix products.
func (be Go) GQAttentionBackward(dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int) {
	gqAttentionBackwardGemm(be.Gemm, dqkv, datt, dOut, qkv, att, b, t, heads, kvHeads, hd)
}

// gqaLayout locates the heads of one qkv row: query head h at h·hd, key and
// value head j at kOff+j·hd and vOff+j·hd; rows are w wide, and query head h
// reads key/value head h/rep.
func gqaLayout(heads, kvHeads, hd int) (w, kOff, vOff, rep int) {
	return (heads + 2*kvHeads) * hd, heads * hd, (heads + kvHeads) * hd, heads / kvHeads
}

// causalSoftmax turns the scores a[:ti+1] of query position ti, whose
// maximum is maxv, into probabilities in place, and zeroes the masked rest
// of the row.
func causalSoftmax(a []float32, ti int, maxv float32) {
	var sum float32
	for t2 := 0; t2 <= ti; t2++ {
		e := float32(softmaxExp(a[t2] - maxv))
		a[t2] = e
		sum += e
	}
	inv := 1 / sum
	for t2 := range a {
		if t2 <= ti {
			a[t2] *= inv
		} else {
			a[t2] = 0
		}
	}
}

// gqAttentionLoops is grouped-query attention in scalar loops. Each
// (sequence, query head) pair is independent.
func gqAttentionLoops(out, att, qkv []float32, b, t, heads, kvHeads, hd int) {
	w, kOff, vOff, rep := gqaLayout(heads, kvHeads, hd)
	c := heads * hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	parallel(b*heads, 1, func(lo, hi int) {
		for bh := lo; bh < hi; bh++ {
			bi, h := bh/heads, bh%heads
			kh := h / rep
			for ti := 0; ti < t; ti++ {
				q := qkv[(bi*t+ti)*w+h*hd : (bi*t+ti)*w+(h+1)*hd]
				a := att[((bi*heads+h)*t+ti)*t : ((bi*heads+h)*t+ti+1)*t]
				maxv := float32(math.Inf(-1))
				for t2 := 0; t2 <= ti; t2++ {
					k := qkv[(bi*t+t2)*w+kOff+kh*hd : (bi*t+t2)*w+kOff+(kh+1)*hd]
					var dot float32
					for i, qv := range q {
						dot += qv * k[i]
					}
					dot *= scale
					a[t2] = dot
					if dot > maxv || dot != dot {
						maxv = dot
					}
				}
				causalSoftmax(a, ti, maxv)
				o := out[(bi*t+ti)*c+h*hd : (bi*t+ti)*c+(h+1)*hd]
				clear(o)
				for t2 := 0; t2 <= ti; t2++ {
					v := qkv[(bi*t+t2)*w+vOff+kh*hd : (bi*t+t2)*w+vOff+(kh+1)*hd]
					wt := a[t2]
					for i := range o {
						o[i] += wt * v[i]
					}
				}
			}
		}
	})
}

// gqAttentionBackwardLoops is gqAttentionLoops' backward pass. The query
// heads that share a key/value head all write its gradient, so the unit of
// parallel work is a (sequence, key/value head) group, whose query heads run
// in order: no two goroutines write the same element, and the sums do not
// depend on the number of cores.
func gqAttentionBackwardLoops(dqkv, datt, dOut, qkv, att []float32, b, t, heads, kvHeads, hd int) {
	w, kOff, vOff, rep := gqaLayout(heads, kvHeads, hd)
	c := heads * hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	parallel(b*kvHeads, 1, func(lo, hi int) {
		for bg := lo; bg < hi; bg++ {
			bi, kh := bg/kvHeads, bg%kvHeads
			for h := kh * rep; h < (kh+1)*rep; h++ {
				for ti := 0; ti < t; ti++ {
					a := att[((bi*heads+h)*t+ti)*t : ((bi*heads+h)*t+ti+1)*t]
					da := datt[((bi*heads+h)*t+ti)*t : ((bi*heads+h)*t+ti+1)*t]
					do := dOut[(bi*t+ti)*c+h*hd : (bi*t+ti)*c+(h+1)*hd]
					// out = Σ att·v
					for t2 := 0; t2 <= ti; t2++ {
						v := qkv[(bi*t+t2)*w+vOff+kh*hd : (bi*t+t2)*w+vOff+(kh+1)*hd]
						dv := dqkv[(bi*t+t2)*w+vOff+kh*hd : (bi*t+t2)*w+vOff+(kh+1)*hd]
						var dot float32
						for i, g := range do {
							dot += v[i] * g
							dv[i] += a[t2] * g
						}
						da[t2] = dot
					}
					// softmax: dpre = att·(datt − Σ att·datt)
					var s float32
					for t2 := 0; t2 <= ti; t2++ {
						s += a[t2] * da[t2]
					}
					q := qkv[(bi*t+ti)*w+h*hd : (bi*t+ti)*w+(h+1)*hd]
					dq := dqkv[(bi*t+ti)*w+h*hd : (bi*t+ti)*w+(h+1)*hd]
					for t2 := 0; t2 <= ti; t2++ {
						dpre := a[t2] * (da[t2] - s) * scale
						k := qkv[(bi*t+t2)*w+kOff+kh*hd : (bi*t+t2)*w+kOff+(kh+1)*hd]
						dk := dqkv[(bi*t+t2)*w+kOff+kh*hd : (bi*t+t2)*w+kOff+(kh+1)*hd]
						for i := range q {
							dq[i] += dpre * k[i]
							dk[i] += dpre * q[i]
						}
					}
				}
			}
		}
	})
}

// SoftmaxCrossEntropy implements Host.
func (Go) SoftmaxCrossEntropy(losses, logits []float32, targets []uint32, rows, vocab int) {
	parallel(rows, chunkRows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			x := logits[r*vocab : (r+1)*vocab]
			maxv := x[0]
			for _, v := range x {
				// The builtin max's result (NaN wins) without its runtime
				// call on WebAssembly.
				if v > maxv || v != v {
					maxv = v
				}
			}
			var sum float64
			for i, v := range x {
				e := softmaxExp(v - maxv)
				x[i] = float32(e)
				sum += e
			}
			inv := float32(1 / sum)
			for i := range x {
				x[i] *= inv
			}
			losses[r] = -float32(math.Log(math.Max(float64(x[targets[r]]), 1e-30)))
		}
	})
}

// CrossEntropyBackward implements Host.
func (Go) CrossEntropyBackward(dLogits, probs []float32, targets []uint32, rows, vocab int, scale float32) {
	parallel(rows, chunkRows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			p, d := probs[r*vocab:(r+1)*vocab], dLogits[r*vocab:(r+1)*vocab]
			for i, v := range p {
				d[i] = v * scale
			}
			d[targets[r]] -= scale
		}
	})
}
