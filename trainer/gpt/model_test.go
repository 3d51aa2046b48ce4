package gpt

import (
	"testing"

	"github.com/psyche-go/psyche/trainer/internal/modeltest"
	"github.com/psyche-go/psyche/trainer/kernels"
)

var tiny = Config{Vocab: 11, Context: 6, Width: 8, Layers: 2, Heads: 2}

// TestGradientCheck compares the analytic gradient of every parameter tensor
// with central finite differences, along a random ±1 direction over the whole
// tensor (a large, robust signal) and on its largest-gradient coordinate.
func TestGradientCheck(t *testing.T) {
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
	for _, c := range []Config{{}, {Vocab: 10, Context: 4, Width: 10, Layers: 1, Heads: 3}} {
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if n := (Config{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4}).NumParams(); n != 256*64+64*64+2*(12*64*64+13*64)+2*64 {
		t.Errorf("NumParams = %d", n)
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
	h, _ := New(tiny, 4, kernels.OnHost(kernels.Go{}))
	a, _ := New(tiny, 4, kernels.Apart(kernels.Go{}))
	modeltest.SameApart(t, h, a, tiny.Vocab)
}

// TestBackendMatchesGo compares the whole model on the binary's backend
// (the GPU's with -tags cuda) with the pure-Go one.
func TestBackendMatchesGo(t *testing.T) {
	d, _ := New(tiny, 4, nil)
	g, _ := New(tiny, 4, kernels.OnHost(kernels.Go{}))
	modeltest.MatchesGo(t, d, g, tiny.Vocab, 1e-4)
}

// TestChunkedHead runs the output layer three rows at a time (a 15-token
// batch: chunks of 3) against all at once.
func TestChunkedHead(t *testing.T) {
	modeltest.ChunkedHead(t, func() *Model {
		m, _ := New(tiny, 4, kernels.OnHost(kernels.Go{}))
		return m
	}, func(m *Model) int { return m.head.ChunkRows() }, tiny.Vocab)
}
