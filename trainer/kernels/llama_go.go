package kernels

import "math"

// RMSNorm implements Host. The mean square is summed in float64, as
// LayerNorm's moments are, so long rows lose no precision.
func (Go) RMSNorm(out, rstd, in, weight []float32, rows, cols int, eps float32) {
	parallel(rows, chunkRows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			x := in[r*cols : (r+1)*cols]
			var ss float64
			for _, v := range x {
				ss += float64(v) * float64(v)
			}
			s := float32(1 / math.Sqrt(ss/float64(cols)+float64(eps)))
			o := out[r*cols : (r+1)*cols]
			for i, v := range x {
				o[i] = v * s * weight[i]
			}
			rstd[r] = s
		}
	})
}

// RMSNormBackward implements Host. With y = w·x·s and s = (mean(x²)+eps)^−½,
// dx = s·w·dy − x·s³·mean(w·dy·x) and dw = Σ_rows dy·x·s. Per-chunk partial
// sums of dw are added in chunk order, so the result does not depend on the
// number of cores.
func (Go) RMSNormBackward(dIn, dWeight, dOut, in, weight, rstd []float32, rows, cols int) {
	chunks := (rows + chunkRows - 1) / chunkRows
	dw := make([]float32, chunks*cols)
	parallel(rows, chunkRows, func(lo, hi int) {
		c := lo / chunkRows
		pw := dw[c*cols : (c+1)*cols]
		for r := lo; r < hi; r++ {
			x, dy, dx := in[r*cols:(r+1)*cols], dOut[r*cols:(r+1)*cols], dIn[r*cols:(r+1)*cols]
			s := rstd[r]
			var dot float32
			for i := range x {
				dot += weight[i] * dy[i] * x[i]
			}
			k := dot * s * s * s / float32(cols)
			for i := range x {
				pw[i] += dy[i] * x[i] * s
				dx[i] += s*weight[i]*dy[i] - x[i]*k
			}
		}
	})
	for c := 0; c < chunks; c++ {
		for i := 0; i < cols; i++ {
			dWeight[i] += dw[c*cols+i]
		}
	}
}

// ropeTable returns cos and sin of pos·θ^(−2i/hd) for pos < t and i < hd/2,
// t rows of hd/2. The inverse frequencies are rounded to float32 first and
// each angle is their float32 product with the position, as Hugging Face's
// LlamaRotaryEmbedding computes them, so a checkpoint sees the same
// rotation here as there.
func ropeTable(t, hd int, theta float32) (cos, sin []float32) {
	half := hd / 2
	cos, sin = make([]float32, t*half), make([]float32, t*half)
	for i := 0; i < half; i++ {
		inv := float32(1 / math.Pow(float64(theta), float64(float32(2*i)/float32(hd))))
		for p := 0; p < t; p++ {
			a := float64(float32(p) * inv)
			cos[p*half+i], sin[p*half+i] = float32(math.Cos(a)), float32(math.Sin(a))
		}
	}
	return cos, sin
}

// RoPE implements Host.
func (Go) RoPE(x []float32, b, t, stride, heads, hd int, theta float32, inverse bool) {
	cos, sin := ropeTable(t, hd, theta)
	half := hd / 2
	parallel(b*t, chunkRows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			p := r % t
			c, s := cos[p*half:(p+1)*half], sin[p*half:(p+1)*half]
			for h := 0; h < heads; h++ {
				v := x[r*stride+h*hd : r*stride+(h+1)*hd]
				lo, hi := v[:half], v[half:hd]
				for i := range lo {
					x0, x1 := lo[i], hi[i]
					sn := s[i]
					if inverse {
						sn = -sn
					}
					lo[i] = x0*c[i] - x1*sn
					hi[i] = x1*c[i] + x0*sn
				}
			}
		}
	})
}

func sigmoid32(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// SwiGLU implements Host.
func (Go) SwiGLU(out, gateUp []float32, rows, n int) {
	parallel(rows, chunkRows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, u, o := gateUp[r*2*n:r*2*n+n], gateUp[r*2*n+n:(r+1)*2*n], out[r*n:(r+1)*n]
			for i, gv := range g {
				o[i] = gv * sigmoid32(gv) * u[i]
			}
		}
	})
}

// SwiGLUBackward implements Host: d gate = dOut·up·σ(g)·(1 + g·(1−σ(g))),
// d up = dOut·silu(g).
func (Go) SwiGLUBackward(dGateUp, gateUp, dOut []float32, rows, n int) {
	parallel(rows, chunkRows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, u := gateUp[r*2*n:r*2*n+n], gateUp[r*2*n+n:(r+1)*2*n]
			dg, du, do := dGateUp[r*2*n:r*2*n+n], dGateUp[r*2*n+n:(r+1)*2*n], dOut[r*n:(r+1)*n]
			for i, gv := range g {
				sg := sigmoid32(gv)
				dg[i] += do[i] * u[i] * sg * (1 + gv*(1-sg))
				du[i] += do[i] * gv * sg
			}
		}
	})
}
