package llama

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// tiny has grouped-query attention (two query heads per key/value head) and
// an untied head; tinyTied has plain multi-head attention and a tied head.
var (
	tiny     = Config{Vocab: 11, Context: 6, Width: 16, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 12, RopeTheta: 10000}
	tinyTied = Config{Vocab: 11, Context: 6, Width: 8, Layers: 2, Heads: 2, KVHeads: 2, Intermediate: 20, RopeTheta: 500000, TiedHead: true}
)

func batch(r *rand.Rand, b, t, vocab int) (in, tg []uint32) {
	in, tg = make([]uint32, b*t), make([]uint32, b*t)
	for i := range in {
		in[i] = uint32(r.IntN(vocab))
		tg[i] = uint32(r.IntN(vocab))
	}
	return in, tg
}

// TestGradientCheck compares the analytic gradient of every parameter tensor
// with central finite differences, along a random ±1 direction over the whole
// tensor (a large, robust signal) and on its largest-gradient coordinate.
func TestGradientCheck(t *testing.T) {
	for _, c := range []Config{tiny, tinyTied} {
		t.Run(fmt.Sprintf("kv%d_tied%v", c.KVHeads, c.TiedHead), func(t *testing.T) { gradientCheck(t, c) })
	}
}

func gradientCheck(t *testing.T, tiny Config) {
	m, err := New(tiny, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Larger weights than the default init, so every path carries signal.
	r := rand.New(rand.NewPCG(2, 2))
	for i := range m.Params {
		m.Params[i] += float32(r.NormFloat64() * 0.3)
	}
	in, tg := batch(r, 2, 5, tiny.Vocab)
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
	grads := append([]float32(nil), m.Grads...)
	_, gTensors := tiny.views(grads)
	const h = 1e-3
	for ti, spec := range tiny.Specs() {
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
			t.Errorf("%s: directional derivative analytic %.6f, numeric %.6f", spec.Name, dot, num)
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
			t.Errorf("%s[%d]: analytic %.6f, numeric %.6f", spec.Name, best, g[best], num)
		}
	}
}

func TestForwardRejectsBadInput(t *testing.T) {
	m, _ := New(tiny, 1, nil)
	for _, tc := range []struct {
		in, tg []uint32
		b, t   int
	}{
		{make([]uint32, 7), nil, 1, 7},          // longer than the context
		{make([]uint32, 3), nil, 1, 4},          // wrong count
		{[]uint32{0, 99}, nil, 1, 2},            // token outside the vocabulary
		{[]uint32{0, 1}, []uint32{0, 11}, 1, 2}, // target outside the vocabulary
	} {
		if _, err := m.Forward(tc.in, tc.tg, tc.b, tc.t); err == nil {
			t.Errorf("accepted %+v", tc)
		}
	}
	if err := m.Backward(); err == nil {
		t.Error("backward without a forward pass")
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Vocab: 10, Context: 4, Width: 12, Layers: 1, Heads: 3, KVHeads: 1, Intermediate: 8, RopeTheta: 10000}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"zero":            func(c *Config) { *c = Config{} },
		"heads ∤ width":   func(c *Config) { c.Heads = 5 },
		"odd head size":   func(c *Config) { c.Width, c.Heads = 9, 3 },
		"kv ∤ heads":      func(c *Config) { c.KVHeads = 2 },
		"kv > heads":      func(c *Config) { c.KVHeads = 6 },
		"no kv heads":     func(c *Config) { c.KVHeads = 0 },
		"no intermediate": func(c *Config) { c.Intermediate = 0 },
		"theta ≤ 1":       func(c *Config) { c.RopeTheta = 1 },
		"eps ≥ 1":         func(c *Config) { c.NormEps = 1 },
	} {
		c := ok
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s: %+v accepted", name, c)
		}
	}
	// embed, 2 norms, qkv (4+2·1 heads of 16), o, gate/up, down per layer,
	// the final norm, and the head unless tied.
	c := Config{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4, KVHeads: 1, Intermediate: 96, RopeTheta: 10000}
	perLayer := 2*64 + 6*16*64 + 64*64 + 2*96*64 + 64*96
	if n := c.NumParams(); n != 256*64+2*perLayer+64+256*64 {
		t.Errorf("NumParams = %d", n)
	}
	c.TiedHead = true
	if n := c.NumParams(); n != 256*64+2*perLayer+64 {
		t.Errorf("tied NumParams = %d", n)
	}
}

// TestTrainingLowersTheLoss takes a few AdamW-free SGD steps on one batch: a
// working backward pass must drive the loss down.
func TestTrainingLowersTheLoss(t *testing.T) {
	m, _ := New(tiny, 3, nil)
	r := rand.New(rand.NewPCG(4, 4))
	in, tg := batch(r, 4, 6, tiny.Vocab)
	first, _ := m.Forward(in, tg, 4, 6)
	var last float32
	for i := 0; i < 100; i++ {
		l, _ := m.Forward(in, tg, 4, 6)
		last = l
		m.ZeroGrad()
		_ = m.Backward()
		for j := range m.Params {
			m.Params[j] -= 0.5 * m.Grads[j]
		}
	}
	if last > first*0.7 {
		t.Fatalf("loss %.3f -> %.3f", first, last)
	}
}
