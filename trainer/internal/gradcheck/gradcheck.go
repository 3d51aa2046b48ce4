// Package gradcheck is the finite-difference gradient test shared by the
// model packages' tests (trainer/gpt, trainer/llama).
package gradcheck

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Model is what Check needs of a model.
type Model interface {
	Forward(inputs, targets []uint32, b, t int) (float32, error)
	ZeroGrad()
	Backward() error
	Tensors() [][]float32     // parameter tensors, views into the parameters
	GradTensors() [][]float32 // gradient tensors, same order
}

// Batch draws b·t random inputs and targets below vocab.
func Batch(r *rand.Rand, b, t, vocab int) (in, tg []uint32) {
	in, tg = make([]uint32, b*t), make([]uint32, b*t)
	for i := range in {
		in[i] = uint32(r.IntN(vocab))
		tg[i] = uint32(r.IntN(vocab))
	}
	return in, tg
}

// Check compares the analytic gradient of every parameter tensor of m with
// central finite differences, along a random ±1 direction over the whole
// tensor (a large, robust signal) and on its largest-gradient coordinate.
// params are m's parameters (all of them, one buffer), which it first
// perturbs beyond the default init so that every path carries signal; names
// name the tensors, in Tensors order; vocab is the model's vocabulary.
func Check(t testing.TB, m Model, params []float32, names []string, vocab int) {
	t.Helper()
	r := rand.New(rand.NewPCG(2, 2))
	for i := range params {
		params[i] += float32(r.NormFloat64() * 0.3)
	}
	in, tg := Batch(r, 2, 5, vocab)
	loss := func() float64 {
		l, err := m.Forward(in, tg, 2, 5)
		if err != nil {
			t.Fatal(err)
		}
		return float64(l)
	}
	loss()
	m.ZeroGrad()
	if err := m.Backward(); err != nil {
		t.Fatal(err)
	}
	var gTensors [][]float32
	for _, g := range m.GradTensors() {
		gTensors = append(gTensors, append([]float32(nil), g...))
	}
	const h = 1e-3
	for ti, name := range names {
		x := m.Tensors()[ti]
		g := gTensors[ti]
		// directional derivative
		u := make([]float32, len(x))
		var dot float64
		for i := range u {
			u[i] = float32(1 - 2*r.IntN(2))
			dot += float64(u[i]) * float64(g[i])
		}
		orig := append([]float32(nil), x...)
		for i := range x {
			x[i] = orig[i] + h*u[i]
		}
		up := loss()
		for i := range x {
			x[i] = orig[i] - h*u[i]
		}
		down := loss()
		copy(x, orig)
		num := (up - down) / (2 * h)
		if d := math.Abs(num - dot); d > 1e-3+2e-2*math.Abs(num) {
			t.Errorf("%s: directional derivative analytic %.6f, numeric %.6f", name, dot, num)
		}
		// largest coordinate
		best := 0
		for i := range g {
			if math.Abs(float64(g[i])) > math.Abs(float64(g[best])) {
				best = i
			}
		}
		x[best] = orig[best] + 1e-2
		up = loss()
		x[best] = orig[best] - 1e-2
		down = loss()
		x[best] = orig[best]
		num = (up - down) / 2e-2
		if d := math.Abs(num - float64(g[best])); d > 1e-3+2e-2*math.Abs(num) {
			t.Errorf("%s[%d]: analytic %.6f, numeric %.6f", name, best, g[best], num)
		}
	}
}
