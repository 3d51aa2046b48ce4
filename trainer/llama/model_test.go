package llama

import (
	"fmt"
	"testing"

	"github.com/psyche-go/psyche/trainer/internal/modeltest"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// tiny has grouped-query attention (two query heads per key/value head) and
// an untied head; tinyTied has plain multi-head attention and a tied head.
var (
	tiny     = Config{Vocab: 11, Context: 6, Width: 16, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 12, RopeTheta: 10000}
	tinyTied = Config{Vocab: 11, Context: 6, Width: 8, Layers: 2, Heads: 2, KVHeads: 2, Intermediate: 20, RopeTheta: 500000, TiedHead: true}
)

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
	modeltest.GradientCheck(t, m, m.Params, tiny.Specs(), func(s TensorSpec) string { return s.Name }, tiny.Vocab)
}

// TestSequenceLosses: each sequence's loss in a batch is its loss alone.
func TestSequenceLosses(t *testing.T) {
	m, _ := New(tiny, 2, nil)
	modeltest.SequenceLosses(t, m, tiny.Vocab)
}

func TestForwardRejectsBadInput(t *testing.T) {
	m, _ := New(tiny, 1, nil)
	modeltest.RejectsBadInput(t, m)
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
	modeltest.TrainingLowersTheLoss(t, m, m.Params, m.Grads, tiny.Vocab)
}

// TestSameApart checks the copies between host buffers and a backend that
// keeps its tensors elsewhere (as the GPU does), on the CPU.
func TestSameApart(t *testing.T) {
	for _, c := range []Config{tiny, tinyTied} {
		h, _ := New(c, 4, kernels.OnHost(kernels.Go{}))
		a, _ := New(c, 4, kernels.Apart(kernels.Go{}))
		modeltest.SameApart(t, h, a, c.Vocab)
	}
}

// TestBackendMatchesGo compares the whole model on the binary's backend
// (the GPU's with -tags cuda) with the pure-Go one.
func TestBackendMatchesGo(t *testing.T) {
	for _, c := range []Config{tiny, tinyTied} {
		d, _ := New(c, 4, nil)
		g, _ := New(c, 4, kernels.OnHost(kernels.Go{}))
		modeltest.MatchesGo(t, d, g, c.Vocab, 1e-4)
	}
}

// TestChunkedHead runs the output layer three rows at a time (a 15-token
// batch: chunks of 3) against all at once.
func TestChunkedHead(t *testing.T) {
	modeltest.ChunkedHead(t, func() *Model {
		m, _ := New(tinyTied, 4, kernels.OnHost(kernels.Go{}))
		return m
	}, func(m *Model) int { return m.head.ChunkRows() }, tinyTied.Vocab)
}
