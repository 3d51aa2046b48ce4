package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// dotLoss is Σ out·g in float64: the scalar whose gradient the backward
// kernels compute when given dOut = g.
func dotLoss(out, g []float32) float64 {
	var s float64
	for i := range out {
		s += float64(out[i]) * float64(g[i])
	}
	return s
}

func TestRMSNorm(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(5, 5))
	rows, cols := 37, 48
	const eps = 1e-5
	in, w := randVec(r, rows*cols), randVec(r, cols)
	out, rstd := make([]float32, rows*cols), make([]float32, rows)
	be.RMSNorm(out, rstd, in, w, rows, cols, eps)
	want := make([]float64, rows*cols)
	for i := 0; i < rows; i++ {
		var ss float64
		for j := 0; j < cols; j++ {
			ss += float64(in[i*cols+j]) * float64(in[i*cols+j])
		}
		s := 1 / math.Sqrt(ss/float64(cols)+eps)
		for j := 0; j < cols; j++ {
			want[i*cols+j] = float64(in[i*cols+j]) * s * float64(w[j])
		}
	}
	if e := maxRelErr(out, want); e > 1e-5 {
		t.Fatalf("forward error %.2g", e)
	}
	g := randVec(r, rows*cols)
	dIn, dW := make([]float32, rows*cols), make([]float32, cols)
	be.RMSNormBackward(dIn, dW, g, in, w, rstd, rows, cols)
	loss := func() float64 {
		be.RMSNorm(out, rstd, in, w, rows, cols, eps)
		return dotLoss(out, g)
	}
	checkGrad(t, "rmsnorm in", in, dIn, loss)
	checkGrad(t, "rmsnorm weight", w, dW, loss)
}

func TestRoPE(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(6, 6))
	b, tt, heads, hd, stride := 2, 7, 3, 8, 3*8+5 // 5 values per row past the heads stay put
	const theta = 500000
	x := randVec(r, b*tt*stride)
	orig := append([]float32(nil), x...)
	be.RoPE(x, b, tt, stride, heads, hd, theta, false)
	want := make([]float64, len(x))
	for i, v := range orig {
		want[i] = float64(v)
	}
	for row := 0; row < b*tt; row++ {
		pos := float64(row % tt)
		for h := 0; h < heads; h++ {
			for i := 0; i < hd/2; i++ {
				a := pos * math.Pow(theta, -2*float64(i)/float64(hd))
				j0, j1 := row*stride+h*hd+i, row*stride+h*hd+i+hd/2
				x0, x1 := float64(orig[j0]), float64(orig[j1])
				want[j0] = x0*math.Cos(a) - x1*math.Sin(a)
				want[j1] = x1*math.Cos(a) + x0*math.Sin(a)
			}
		}
	}
	if e := maxRelErr(x, want); e > 1e-5 {
		t.Fatalf("forward error %.2g", e)
	}
	// The inverse undoes the rotation, and, being its transpose, is the
	// backward pass: Σ R(x)·g = Σ x·Rᵀ(g).
	be.RoPE(x, b, tt, stride, heads, hd, theta, true)
	back := make([]float64, len(orig))
	for i, v := range orig {
		back[i] = float64(v)
	}
	if e := maxRelErr(x, back); e > 1e-5 {
		t.Fatalf("inverse does not undo the rotation: error %.2g", e)
	}
	g := randVec(r, len(x))
	rg := append([]float32(nil), g...)
	be.RoPE(rg, b, tt, stride, heads, hd, theta, true)
	rx := append([]float32(nil), orig...)
	be.RoPE(rx, b, tt, stride, heads, hd, theta, false)
	if a, b := dotLoss(rx, g), dotLoss(orig, rg); math.Abs(a-b) > 1e-4*math.Max(1, math.Abs(a)) {
		t.Fatalf("inverse is not the transpose: %g vs %g", a, b)
	}
}

func TestSwiGLU(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(7, 7))
	rows, n := 19, 24
	gu := randVec(r, rows*2*n)
	out := make([]float32, rows*n)
	be.SwiGLU(out, gu, rows, n)
	want := make([]float64, rows*n)
	for i := 0; i < rows; i++ {
		for j := 0; j < n; j++ {
			g, u := float64(gu[i*2*n+j]), float64(gu[i*2*n+n+j])
			want[i*n+j] = g / (1 + math.Exp(-g)) * u
		}
	}
	if e := maxRelErr(out, want); e > 1e-5 {
		t.Fatalf("forward error %.2g", e)
	}
	g := randVec(r, len(out))
	d := make([]float32, len(gu))
	be.SwiGLUBackward(d, gu, g, rows, n)
	checkGrad(t, "swiglu", gu, d, func() float64 {
		be.SwiGLU(out, gu, rows, n)
		return dotLoss(out, g)
	})
	// The up half: checkGrad's coordinates are 0, ⅓, ½ and the end of the
	// buffer; row 0's up values start at n.
	checkGrad(t, "swiglu up", gu[n:], d[n:], func() float64 {
		be.SwiGLU(out, gu, rows, n)
		return dotLoss(out, g)
	})
}

func TestGQAttention(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(8, 8))
	for _, tc := range []struct{ b, t, heads, kv, hd int }{
		{2, 5, 4, 2, 4}, {1, 6, 6, 1, 2}, {2, 4, 3, 3, 4},
	} {
		w := (tc.heads + 2*tc.kv) * tc.hd
		rep := tc.heads / tc.kv
		qkv := randVec(r, tc.b*tc.t*w)
		c := tc.heads * tc.hd
		out, att := make([]float32, tc.b*tc.t*c), make([]float32, tc.b*tc.heads*tc.t*tc.t)
		be.GQAttention(out, att, qkv, tc.b, tc.t, tc.heads, tc.kv, tc.hd)
		want := make([]float64, len(out))
		for bi := 0; bi < tc.b; bi++ {
			for h := 0; h < tc.heads; h++ {
				kh := h / rep
				for i := 0; i < tc.t; i++ {
					s := make([]float64, i+1)
					mx := math.Inf(-1)
					for j := 0; j <= i; j++ {
						for d := 0; d < tc.hd; d++ {
							s[j] += float64(qkv[(bi*tc.t+i)*w+h*tc.hd+d]) * float64(qkv[(bi*tc.t+j)*w+c+kh*tc.hd+d])
						}
						s[j] /= math.Sqrt(float64(tc.hd))
						mx = math.Max(mx, s[j])
					}
					var z float64
					for j := range s {
						s[j] = math.Exp(s[j] - mx)
						z += s[j]
					}
					for d := 0; d < tc.hd; d++ {
						var o float64
						for j := range s {
							o += s[j] / z * float64(qkv[(bi*tc.t+j)*w+c+tc.kv*tc.hd+kh*tc.hd+d])
						}
						want[(bi*tc.t+i)*c+h*tc.hd+d] = o
					}
				}
			}
		}
		if e := maxRelErr(out, want); e > 1e-5 {
			t.Fatalf("%+v: forward error %.2g", tc, e)
		}
		g := randVec(r, len(out))
		dqkv, datt := make([]float32, len(qkv)), make([]float32, len(att))
		be.GQAttentionBackward(dqkv, datt, g, qkv, att, tc.b, tc.t, tc.heads, tc.kv, tc.hd)
		loss := func() float64 {
			be.GQAttention(out, att, qkv, tc.b, tc.t, tc.heads, tc.kv, tc.hd)
			return dotLoss(out, g)
		}
		checkGrad(t, "gqa qkv", qkv, dqkv, loss)
		// A key and a value of the first row of the second sequence, which
		// every later query of that sequence reads: shared by rep heads.
		row := (tc.b - 1) * tc.t * w
		checkGrad(t, "gqa k", qkv[row+c:], dqkv[row+c:], loss)
		checkGrad(t, "gqa v", qkv[row+c+tc.kv*tc.hd:], dqkv[row+c+tc.kv*tc.hd:], loss)
	}
}

func BenchmarkRMSNorm(b *testing.B) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(1, 1))
	rows, cols := 1024, 512
	in, w := randVec(r, rows*cols), randVec(r, cols)
	out, rstd := make([]float32, rows*cols), make([]float32, rows)
	b.SetBytes(int64(4 * rows * cols))
	for b.Loop() {
		be.RMSNorm(out, rstd, in, w, rows, cols, 1e-5)
	}
}

func BenchmarkGQAttention(b *testing.B) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(1, 1))
	bs, t, heads, kv, hd := 4, 128, 8, 2, 64
	qkv := randVec(r, bs*t*(heads+2*kv)*hd)
	out, att := make([]float32, bs*t*heads*hd), make([]float32, bs*heads*t*t)
	for b.Loop() {
		be.GQAttention(out, att, qkv, bs, t, heads, kv, hd)
	}
}

// TestGQAttentionGemmMatchesLoops: the matrix-product attention (what
// GQAttention runs on the CPU) and the scalar loops (GPT's Attention) agree
// on a shape with many rows per head and several groups.
func TestGQAttentionGemmMatchesLoops(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(9, 9))
	b, tt, heads, kv, hd := 2, 40, 6, 2, 16
	qkv := randVec(r, b*tt*(heads+2*kv)*hd)
	n, na := b*tt*heads*hd, b*heads*tt*tt
	o1, a1, o2, a2 := make([]float32, n), make([]float32, na), make([]float32, n), randVec(r, na)
	gqAttentionLoops(o1, a1, qkv, b, tt, heads, kv, hd)
	be.GQAttention(o2, a2, qkv, b, tt, heads, kv, hd)
	near := func(what string, got, want []float32) {
		t.Helper()
		w := make([]float64, len(want))
		for i, v := range want {
			w[i] = float64(v)
		}
		if e := maxRelErr(got, w); e > 1e-5 {
			t.Fatalf("%s: error %.2g", what, e)
		}
	}
	near("out", o2, o1)
	near("att", a2, a1)
	g, d0 := randVec(r, n), randVec(r, len(qkv))
	d1, d2 := append([]float32(nil), d0...), append([]float32(nil), d0...)
	gqAttentionBackwardLoops(d1, make([]float32, na), g, qkv, a1, b, tt, heads, kv, hd)
	be.GQAttentionBackward(d2, randVec(r, na), g, qkv, a1, b, tt, heads, kv, hd)
	near("dqkv", d2, d1)
}
