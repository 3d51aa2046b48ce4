// Package modeltest holds the tests the language models (trainer/gpt,
// trainer/llama) share: the finite-difference gradient check, the rejection
// of bad batches, a few SGD steps that must lower the loss, and the training
// step their benchmarks time.
package modeltest

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/psyche-go/psyche/trainer/internal/lm"
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

// GradientCheck compares the analytic gradient of every parameter tensor of m with
// central finite differences, along a random ±1 direction over the whole
// tensor (a large, robust signal) and on its largest-gradient coordinate.
// params are m's parameters (all of them, one buffer), which it first
// perturbs beyond the default init so that every path carries signal; specs
// are the tensors' specs, in Tensors order, and name names one; vocab is the
// model's vocabulary.
func GradientCheck[S any](t testing.TB, m Model, params []float32, specs []S, name func(S) string, vocab int) {
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
	for ti, spec := range specs {
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
			t.Errorf("%s: directional derivative analytic %.6f, numeric %.6f", name(spec), dot, num)
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
			t.Errorf("%s[%d]: analytic %.6f, numeric %.6f", name(spec), best, g[best], num)
		}
	}
}

// RejectsBadInput checks that m's Forward refuses batches that do not fit a
// model of context 6 and vocabulary 11 (the tests' tiny configs), and that
// Backward refuses to run before a forward pass.
func RejectsBadInput(t testing.TB, m Model) {
	t.Helper()
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

// Steps runs b.Loop over training steps of m on one batch of bs sequences of
// t tokens: forward, ZeroGrad, backward.
func Steps(b *testing.B, m Model, in, tg []uint32, bs, t int) {
	for b.Loop() {
		if _, err := m.Forward(in, tg, bs, t); err != nil {
			b.Fatal(err)
		}
		m.ZeroGrad()
		if err := m.Backward(); err != nil {
			b.Fatal(err)
		}
	}
}

// TrainingLowersTheLoss takes a few AdamW-free SGD steps of m on one batch
// (params and grads are its parameter and gradient buffers, vocab its
// vocabulary): a working backward pass must drive the loss down.
func TrainingLowersTheLoss(t testing.TB, m Model, params, grads []float32, vocab int) {
	t.Helper()
	r := rand.New(rand.NewPCG(4, 4))
	in, tg := Batch(r, 4, 6, vocab)
	first, _ := m.Forward(in, tg, 4, 6)
	var last float32
	for i := 0; i < 100; i++ {
		l, _ := m.Forward(in, tg, 4, 6)
		last = l
		m.ZeroGrad()
		_ = m.Backward()
		for j := range params {
			params[j] -= 0.5 * grads[j]
		}
	}
	if last > first*0.7 {
		t.Fatalf("loss %.3f -> %.3f", first, last)
	}
}

// Logits is a model that shows its last forward pass's output.
type Logits interface {
	Model
	Logits() []float32
}

// SameApart trains two models, equal but for the backend (host is on a
// host backend, apart on kernels.Apart over the same kernels, which keeps
// its tensors in memory of its own, as a GPU does), and requires every
// loss, gradient, logit and parameter to be the same bit for bit: the
// copies between the host's buffers and the backend's are made when they
// must be. The steps change parameters and gradients in host memory between
// passes, as the optimizers do, and accumulate two backward passes without
// clearing.
func SameApart(t testing.TB, host, apart Logits, vocab int) {
	t.Helper()
	r := rand.New(rand.NewPCG(5, 5))
	for step := 0; step < 4; step++ {
		in, tg := Batch(r, 2, 5, vocab)
		var losses [2]float32
		for i, m := range []Logits{host, apart} {
			l, err := m.Forward(in, tg, 2, 5)
			if err != nil {
				t.Fatal(err)
			}
			losses[i] = l
			if step != 2 {
				m.ZeroGrad()
			} else {
				// Gradients changed on the host before a backward pass
				// that accumulates onto them.
				for _, g := range m.GradTensors() {
					for j := range g {
						g[j] = 0.5 * g[j]
					}
				}
			}
			if err := m.Backward(); err != nil {
				t.Fatal(err)
			}
			if step == 1 { // a second pass, accumulated
				if err := m.Backward(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if losses[0] != losses[1] {
			t.Fatalf("step %d: loss %v on the host backend, %v apart", step, losses[0], losses[1])
		}
		hg, ag := host.GradTensors(), apart.GradTensors()
		hp, ap := host.Tensors(), apart.Tensors()
		for i := range hg {
			for j := range hg[i] {
				if hg[i][j] != ag[i][j] {
					t.Fatalf("step %d: gradient %d[%d] %v on the host backend, %v apart", step, i, j, hg[i][j], ag[i][j])
				}
				// An SGD step, in host memory.
				hp[i][j] -= 0.1 * hg[i][j]
				ap[i][j] -= 0.1 * ag[i][j]
			}
		}
	}
	// Logits of a pass without targets.
	in, _ := Batch(r, 1, 4, vocab)
	for _, m := range []Logits{host, apart} {
		if _, err := m.Forward(in, nil, 1, 4); err != nil {
			t.Fatal(err)
		}
	}
	hl, al := host.Logits(), apart.Logits()
	if len(hl) != len(al) || len(hl) == 0 {
		t.Fatalf("logits: %d values on the host backend, %d apart", len(hl), len(al))
	}
	for i := range hl {
		if hl[i] != al[i] {
			t.Fatalf("logit %d: %v on the host backend, %v apart", i, hl[i], al[i])
		}
	}
}

// MatchesGo runs one forward and backward pass of two models, equal but
// for the backend (m on the binary's default, goModel on the pure-Go one),
// and requires the loss and every gradient to agree within what float32
// sums in another order (or bf16 products) give: loss to 1e-4 relative,
// each gradient tensor to tol of its largest magnitude. On the CPU builds
// the two are the same kernels; on the GPU this checks the whole model.
func MatchesGo(t testing.TB, m, goModel Model, vocab int, tol float64) {
	t.Helper()
	in, tg := Batch(rand.New(rand.NewPCG(6, 6)), 3, 5, vocab)
	var losses [2]float32
	for i, x := range []Model{m, goModel} {
		l, err := x.Forward(in, tg, 3, 5)
		if err != nil {
			t.Fatal(err)
		}
		losses[i] = l
		x.ZeroGrad()
		if err := x.Backward(); err != nil {
			t.Fatal(err)
		}
	}
	if d := math.Abs(float64(losses[0] - losses[1])); d > 1e-4*math.Abs(float64(losses[1])) {
		t.Fatalf("loss %v, the Go backend's %v", losses[0], losses[1])
	}
	got, want := m.GradTensors(), goModel.GradTensors()
	for i := range want {
		scale := 1e-12
		for _, v := range want[i] {
			scale = math.Max(scale, math.Abs(float64(v)))
		}
		for j, v := range want[i] {
			if d := math.Abs(float64(got[i][j] - v)); !(d <= tol*scale) {
				t.Fatalf("gradient %d[%d] = %g, the Go backend's %g (largest %g)", i, j, got[i][j], v, scale)
			}
		}
	}
}

// ChunkedHead compares a model whose output layer computes its logits
// three rows at a time (a 15-token batch: five chunks) with one that
// computes them all at once: same loss and gradients up to the order of
// float32 sums. build makes a model (each call an equal one); chunkRows
// reports how many rows of logits a model computes at a time.
func ChunkedHead[M Model](t testing.TB, build func() M, chunkRows func(M) int, vocab int) {
	t.Helper()
	old := lm.MaxHeadValues
	defer func() { lm.MaxHeadValues = old }()
	lm.MaxHeadValues = 3 * vocab
	chunked := build()
	if _, err := chunked.Forward(make([]uint32, 15), make([]uint32, 15), 3, 5); err != nil {
		t.Fatal(err)
	}
	if n := chunkRows(chunked); n != 3 {
		t.Fatalf("the output layer computes %d rows at a time, want 3", n)
	}
	lm.MaxHeadValues = old
	whole := build()
	MatchesGo(t, chunked, whole, vocab, 1e-5)
}

// Sequences is a model that reports each sequence's loss.
type Sequences interface {
	Model
	SequenceLosses(t int) []float32
}

// SequenceLosses checks that a batch's per-sequence losses are each
// sequence's loss on its own (what a witness recomputes from two of them)
// and average to the batch's loss.
func SequenceLosses(t testing.TB, m Sequences, vocab int) {
	t.Helper()
	const b, seq = 3, 4
	in, tg := Batch(rand.New(rand.NewPCG(8, 8)), b, seq, vocab)
	loss, err := m.Forward(in, tg, b, seq)
	if err != nil {
		t.Fatal(err)
	}
	got := m.SequenceLosses(seq)
	if len(got) != b {
		t.Fatalf("%d sequence losses for %d sequences", len(got), b)
	}
	var sum float64
	for i, l := range got {
		alone, err := m.Forward(in[i*seq:(i+1)*seq], tg[i*seq:(i+1)*seq], 1, seq)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(float64(l-alone)) > 1e-5*math.Abs(float64(alone)) {
			t.Errorf("sequence %d: %v in the batch, %v alone", i, l, alone)
		}
		sum += float64(l)
	}
	if math.Abs(sum/b-float64(loss)) > 1e-6*float64(loss) {
		t.Errorf("the sequences' losses average %v, the batch's is %v", sum/b, loss)
	}
}
