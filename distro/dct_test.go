package distro

import (
	"math"
	"math/rand/v2"
	"testing"
)

// referenceDCT2 is the orthonormal 2-D DCT-II straight from its definition,
// in float64: Y[u][v] = s_u·s_v·Σ_i Σ_j x[i][j]·cos(π(2i+1)u/2h)·cos(π(2j+1)v/2w).
func referenceDCT2(x []float32, h, w int) []float64 {
	y := make([]float64, h*w)
	for u := 0; u < h; u++ {
		for v := 0; v < w; v++ {
			var sum float64
			for i := 0; i < h; i++ {
				for j := 0; j < w; j++ {
					sum += float64(x[i*w+j]) * math.Cos(math.Pi*float64((2*i+1)*u)/float64(2*h)) *
						math.Cos(math.Pi*float64((2*j+1)*v)/float64(2*w))
				}
			}
			su, sv := math.Sqrt(2/float64(h)), math.Sqrt(2/float64(w))
			if u == 0 {
				su = math.Sqrt(1 / float64(h))
			}
			if v == 0 {
				sv = math.Sqrt(1 / float64(w))
			}
			y[u*w+v] = su * sv * sum
		}
	}
	return y
}

func randomTile(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// relErr is ‖a−b‖/‖b‖.
func relErr[A, B float32 | float64](a []A, b []B) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / max(den, 1e-300))
}

var dctShapes = [][2]int{{1, 1}, {1, 2}, {2, 2}, {1, 64}, {64, 1}, {8, 8}, {3, 5}, {6, 10}, {48, 12}, {29, 64}, {64, 64}, {7, 49}}

func TestDCTMatchesDirectSums(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range dctShapes {
		h, w := s[0], s[1]
		p := newDCT2(h, w)
		for trial := 0; trial < 3; trial++ {
			x := randomTile(r, h*w)
			want := referenceDCT2(x, h, w)
			got := append([]float32(nil), x...)
			p.forward(got, make([]float32, h*w))
			if e := relErr(got, want); e > 1e-5 {
				t.Errorf("%dx%d: forward differs from the direct sums by %.2g (relative)", h, w, e)
			}
			p.inverse(got, make([]float32, h*w))
			if e := relErr(got, x); e > 1e-5 {
				t.Errorf("%dx%d: inverse(forward(x)) differs from x by %.2g (relative)", h, w, e)
			}
		}
	}
}

func TestDCTIsOrthonormal(t *testing.T) {
	// Parseval: an orthonormal transform keeps the energy.
	r := rand.New(rand.NewPCG(3, 4))
	p := newDCT2(64, 64)
	x := randomTile(r, 64*64)
	y := append([]float32(nil), x...)
	p.forward(y, make([]float32, len(y)))
	var ex, ey float64
	for i := range x {
		ex += float64(x[i]) * float64(x[i])
		ey += float64(y[i]) * float64(y[i])
	}
	if math.Abs(ex-ey) > 1e-5*ex {
		t.Fatalf("energy %g before, %g after", ex, ey)
	}
}
