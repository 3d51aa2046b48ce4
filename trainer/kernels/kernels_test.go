package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// These tests compare whatever backend the binary was built with (pure Go,
// -tags openblas or -tags cuda) against straightforward float64 references,
// so they run unchanged on a GPU machine.

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func maxRelErr(got []float32, want []float64) float64 {
	var worst, scale float64
	for _, w := range want {
		scale = math.Max(scale, math.Abs(w))
	}
	scale = math.Max(scale, 1e-6)
	for i := range got {
		worst = math.Max(worst, math.Abs(float64(got[i])-want[i])/scale)
	}
	return worst
}

func TestBackendName(t *testing.T) {
	if Default().Name() == "" {
		t.Fatal("backend has no name")
	}
	t.Logf("backend: %s", Default().Name())
}

func TestGemm(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(1, 1))
	for _, tc := range []struct {
		m, n, k     int
		ta, tb      bool
		alpha, beta float32
	}{
		{1, 1, 1, false, false, 1, 0}, {7, 5, 3, false, true, 1, 0}, {64, 48, 32, true, false, 0.5, 1},
		{33, 65, 17, true, true, 2, -1}, {128, 256, 64, false, true, 1, 1},
	} {
		// Stored shapes: A is m×k (or k×m if transposed), B is k×n (or n×k).
		ar, ac := tc.m, tc.k
		if tc.ta {
			ar, ac = tc.k, tc.m
		}
		br, bc := tc.k, tc.n
		if tc.tb {
			br, bc = tc.n, tc.k
		}
		lda, ldb, ldc := ac+3, bc+1, tc.n+2 // strides wider than the rows
		a, b, c := randVec(r, ar*lda), randVec(r, br*ldb), randVec(r, tc.m*ldc)
		want := make([]float64, len(c))
		for i := range c {
			want[i] = float64(c[i])
		}
		for i := 0; i < tc.m; i++ {
			for j := 0; j < tc.n; j++ {
				var s float64
				for p := 0; p < tc.k; p++ {
					var av, bv float32
					if tc.ta {
						av = a[p*lda+i]
					} else {
						av = a[i*lda+p]
					}
					if tc.tb {
						bv = b[j*ldb+p]
					} else {
						bv = b[p*ldb+j]
					}
					s += float64(av) * float64(bv)
				}
				want[i*ldc+j] = float64(tc.alpha)*s + float64(tc.beta)*float64(c[i*ldc+j])
			}
		}
		be.Gemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)
		if e := maxRelErr(c, want); e > 1e-5 {
			t.Errorf("%+v: error %.2g", tc, e)
		}
	}
}

func TestLayerNorm(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(2, 2))
	rows, cols := 37, 48
	in, w, b := randVec(r, rows*cols), randVec(r, cols), randVec(r, cols)
	out, mean, rstd := make([]float32, rows*cols), make([]float32, rows), make([]float32, rows)
	be.LayerNorm(out, mean, rstd, in, w, b, rows, cols)
	want := make([]float64, rows*cols)
	for i := 0; i < rows; i++ {
		var m, v float64
		for j := 0; j < cols; j++ {
			m += float64(in[i*cols+j])
		}
		m /= float64(cols)
		for j := 0; j < cols; j++ {
			d := float64(in[i*cols+j]) - m
			v += d * d
		}
		s := 1 / math.Sqrt(v/float64(cols)+1e-5)
		for j := 0; j < cols; j++ {
			want[i*cols+j] = (float64(in[i*cols+j])-m)*s*float64(w[j]) + float64(b[j])
		}
	}
	if e := maxRelErr(out, want); e > 1e-5 {
		t.Fatalf("forward error %.2g", e)
	}
	// Backward against finite differences of L = Σ out·g.
	g := randVec(r, rows*cols)
	dIn, dW, dB := make([]float32, rows*cols), make([]float32, cols), make([]float32, cols)
	be.LayerNormBackward(dIn, dW, dB, g, in, w, mean, rstd, rows, cols)
	loss := func() float64 {
		be.LayerNorm(out, mean, rstd, in, w, b, rows, cols)
		return dotLoss(out, g)
	}
	checkGrad(t, "layernorm input", in, dIn, loss)
	checkGrad(t, "layernorm weight", w, dW, loss)
	checkGrad(t, "layernorm bias", b, dB, loss)
}

// checkGrad compares grad with central differences of loss in x, on a few
// coordinates.
func checkGrad(t *testing.T, name string, x, grad []float32, loss func() float64) {
	t.Helper()
	const h = 1e-2
	for _, i := range []int{0, len(x) / 3, len(x) / 2, len(x) - 1} {
		orig := x[i]
		x[i] = orig + h
		up := loss()
		x[i] = orig - h
		down := loss()
		x[i] = orig
		num := (up - down) / (2 * h)
		if d := math.Abs(num - float64(grad[i])); d > 2e-2*math.Max(1, math.Abs(num)) {
			t.Errorf("%s[%d]: analytic %.5f, numeric %.5f", name, i, grad[i], num)
		}
	}
}

func TestGELU(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(3, 3))
	in := randVec(r, 1000)
	out := make([]float32, len(in))
	be.GELU(out, in)
	want := make([]float64, len(in))
	for i, x := range in {
		xf := float64(x)
		want[i] = 0.5 * xf * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(xf+0.044715*xf*xf*xf)))
	}
	if e := maxRelErr(out, want); e > 1e-5 {
		t.Fatalf("forward error %.2g", e)
	}
	g := randVec(r, len(in))
	dIn := make([]float32, len(in))
	be.GELUBackward(dIn, in, g)
	checkGrad(t, "gelu", in, dIn, func() float64 {
		be.GELU(out, in)
		return dotLoss(out, g)
	})
}

func TestAttention(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(4, 4))
	b, tt, c, heads := 2, 5, 8, 2
	hs := c / heads
	qkv := randVec(r, b*tt*3*c)
	out, att := make([]float32, b*tt*c), make([]float32, b*heads*tt*tt)
	be.Attention(out, att, qkv, b, tt, c, heads)
	want := make([]float64, len(out))
	for bi := 0; bi < b; bi++ {
		for h := 0; h < heads; h++ {
			for i := 0; i < tt; i++ {
				w := make([]float64, i+1)
				var mx = math.Inf(-1)
				for j := 0; j <= i; j++ {
					var s float64
					for d := 0; d < hs; d++ {
						s += float64(qkv[(bi*tt+i)*3*c+h*hs+d]) * float64(qkv[(bi*tt+j)*3*c+c+h*hs+d])
					}
					w[j] = s / math.Sqrt(float64(hs))
					mx = math.Max(mx, w[j])
				}
				var z float64
				for j := range w {
					w[j] = math.Exp(w[j] - mx)
					z += w[j]
				}
				for d := 0; d < hs; d++ {
					var s float64
					for j := range w {
						s += w[j] / z * float64(qkv[(bi*tt+j)*3*c+2*c+h*hs+d])
					}
					want[(bi*tt+i)*c+h*hs+d] = s
				}
			}
		}
	}
	if e := maxRelErr(out, want); e > 1e-5 {
		t.Fatalf("forward error %.2g", e)
	}
	g := randVec(r, len(out))
	dqkv, datt := make([]float32, len(qkv)), make([]float32, len(att))
	be.AttentionBackward(dqkv, datt, g, qkv, att, b, tt, c, heads)
	checkGrad(t, "attention qkv", qkv, dqkv, func() float64 {
		be.Attention(out, att, qkv, b, tt, c, heads)
		return dotLoss(out, g)
	})
}

func TestSoftmaxCrossEntropy(t *testing.T) {
	be := Slices(Default())
	r := rand.New(rand.NewPCG(5, 5))
	rows, vocab := 9, 31
	logits := randVec(r, rows*vocab)
	orig := append([]float32(nil), logits...)
	targets := make([]uint32, rows)
	for i := range targets {
		targets[i] = uint32(r.IntN(vocab))
	}
	losses := make([]float32, rows)
	be.SoftmaxCrossEntropy(losses, logits, targets, rows, vocab)
	want := make([]float64, rows)
	for i := 0; i < rows; i++ {
		var z float64
		for j := 0; j < vocab; j++ {
			z += math.Exp(float64(orig[i*vocab+j]))
		}
		want[i] = math.Log(z) - float64(orig[i*vocab+int(targets[i])])
	}
	if e := maxRelErr(losses, want); e > 1e-5 {
		t.Fatalf("loss error %.2g", e)
	}
	d := make([]float32, rows*vocab)
	be.CrossEntropyBackward(d, logits, targets, rows, vocab, 0.5)
	x := append([]float32(nil), orig...)
	checkGrad(t, "cross entropy", x, d, func() float64 {
		l := append([]float32(nil), x...)
		be.SoftmaxCrossEntropy(losses, l, targets, rows, vocab)
		var s float64
		for _, v := range losses {
			s += 0.5 * float64(v)
		}
		return s
	})
}

// BenchmarkGemm reports the matmul rate of this build, the number the
// trainer's achieved GFLOP/s is compared with.
func BenchmarkGemm(b *testing.B) {
	be := Slices(Default())
	n := 512
	r := rand.New(rand.NewPCG(6, 6))
	x, y, z := randVec(r, n*n), randVec(r, n*n), make([]float32, n*n)
	for b.Loop() {
		be.Gemm(false, true, n, n, n, 1, x, n, y, n, 0, z, n)
	}
	b.ReportMetric(2*float64(n*n*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
