package distro

import (
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

// requireVectorEnv, set to 1, turns "this CPU has no AVX2" from a skip into a
// failure: scripts/test sets it so that the vector kernels are always checked,
// on a CPU without AVX2 under an emulator that has it.
const requireVectorEnv = "DISTRO_REQUIRE_VECTOR_KERNELS"

// TestKernelsMatchGo checks the vector kernels bit for bit against the plain
// Go loops, for lengths around the vector width.
func TestKernelsMatchGo(t *testing.T) {
	if !vectorKernels || !hasAVX2 {
		if os.Getenv(requireVectorEnv) == "1" {
			t.Fatalf("%s=1 but the vector kernels cannot run here (vector kernels built: %v, CPU and OS have AVX2: %v)",
				requireVectorEnv, vectorKernels, hasAVX2)
		}
		t.Skip("no vector kernels on this machine")
	}
	r := rand.New(rand.NewPCG(1, 1))
	vec := func(n int) []float32 { return randomTile(r, n) }
	for n := 0; n <= 70; n++ {
		a, b := vec(n), vec(n)
		g := float32(r.NormFloat64())
		u1, v1, u2, v2 := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		butterfly(u1, v1, a, b, g)
		butterflyGo(u2, v2, a, b, g)
		if !slices.Equal(u1, u2) || !slices.Equal(v1, v2) {
			t.Fatalf("butterfly n=%d", n)
		}
		unbutterfly(u1, v1, a, b, g)
		unbutterflyGo(u2, v2, a, b, g)
		if !slices.Equal(u1, u2) || !slices.Equal(v1, v2) {
			t.Fatalf("unbutterfly n=%d", n)
		}
		add(u1, a, b)
		addGo(u2, a, b)
		if !slices.Equal(u1, u2) {
			t.Fatalf("add n=%d", n)
		}
		copy(u1, a)
		copy(u2, a)
		axpy(u1, g, b)
		axpyGo(u2, g, b)
		if !slices.Equal(u1, u2) {
			t.Fatalf("axpy n=%d", n)
		}
		momentum(u1, b, 0.9, g)
		momentumGo(u2, b, 0.9, g)
		if !slices.Equal(u1, u2) {
			t.Fatalf("momentum n=%d", n)
		}
		w1, w2 := slices.Clone(a), slices.Clone(a)
		for i := range w1 { // mean squares are never negative
			w1[i] *= w1[i]
			w2[i] = w1[i]
		}
		var s1, s2 [4]float64
		meanSquare(w1, b, 0.95, 1-0.95, &s1)
		meanSquareGo(w2, b, 0.95, 1-0.95, &s2)
		if !slices.Equal(w1, w2) || s1 != s2 {
			t.Fatalf("meanSquare n=%d", n)
		}
		copy(u1, b)
		copy(u2, b)
		rmsDivide(u1, w1, 1.5, 0.01)
		rmsDivideGo(u2, w2, 1.5, 0.01)
		if !slices.Equal(u1, u2) {
			t.Fatalf("rmsDivide n=%d", n)
		}
		for from := 0; from <= n; from++ {
			thr := math.Float32bits(0.5)
			if got, want := nextAbove(a, from, thr), nextAboveGo(a, from, thr); got != want {
				t.Fatalf("nextAbove n=%d from=%d: %d, want %d", n, from, got, want)
			}
		}
	}
}
