package goengine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/goengine"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

var (
	small    = modelspec.Config{Arch: coordinator.ArchGPT, GPT: gpt.Config{Vocab: 32, Context: 8, Width: 16, Layers: 1, Heads: 2}}
	smallOpt = distro.Options{Chunk: 8, TopK: 4, Quantize1Bit: true, Decay: 0.9}
)

func openGo(t *testing.T, seed uint64) engine.Engine {
	t.Helper()
	m, err := runmodel.New(small, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := runmodel.HostWeights(m)
	if err != nil {
		t.Fatal(err)
	}
	e, err := goengine.New(nil).Open(context.Background(), engine.Spec{Weights: w, Optimizer: smallOpt})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func batch(seqs, seqLen int) engine.Batch {
	b := engine.Batch{Seqs: seqs, SeqLen: seqLen, Inputs: make([]uint32, seqs*seqLen), Targets: make([]uint32, seqs*seqLen)}
	for i := range b.Inputs {
		b.Inputs[i], b.Targets[i] = uint32(i*7%32), uint32(i*5%32)
	}
	return b
}

// TestGoEngineBatches: a batch whose shape and tokens disagree, or that is
// longer than the model's context, is refused before any compute.
func TestGoEngineBatches(t *testing.T) {
	e := openGo(t, 1)
	defer e.Close()
	short := batch(2, 8)
	short.Targets = short.Targets[:10]
	for _, tc := range []struct {
		name string
		b    engine.Batch
		want string
	}{
		{"empty", engine.Batch{}, "empty batch"},
		{"too long", batch(1, 9), "context is 8"},
		{"short targets", short, "16 inputs and 10 targets"},
	} {
		if _, err := e.Gradient(context.Background(), tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if l, err := e.Gradient(context.Background(), batch(2, 8)); err != nil || len(l.Seqs) != 2 {
		t.Fatalf("a good batch: %v, %v", l, err)
	}
}

// TestGoEngineTryUndo: Try changes the model, Undo restores it bit for bit,
// and the frame Step makes from the kept gradient is the same before and
// after (the gradient survives); after Close every call fails.
func TestGoEngineTryUndo(t *testing.T) {
	ctx := context.Background()
	e, peer := openGo(t, 1), openGo(t, 2)
	defer peer.Close()
	if _, err := peer.Gradient(ctx, batch(2, 8)); err != nil {
		t.Fatal(err)
	}
	f, err := peer.Step(ctx, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Undo(ctx); !errors.Is(err, engine.ErrNoUndo) {
		t.Fatalf("Undo before Try: %v", err)
	}
	w, err := e.Weights()
	if err != nil {
		t.Fatal(err)
	}
	m := w.Host.(runmodel.Model) // the Go engine's own model
	before := slices.Clone(m.Tensors()[0])
	plan, err := distro.NewPlan(m.Shapes(), smallOpt)
	if err != nil {
		t.Fatal(err)
	}
	c, err := plan.Combine([]*distro.Frame{f})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Try(ctx, c, 0.1); err != nil {
		t.Fatal(err)
	}
	if slices.Equal(m.Tensors()[0], before) {
		t.Fatal("Try left the model as it was")
	}
	if err := e.Undo(ctx); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Tensors()[0], before) {
		t.Fatal("Undo did not restore the model")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Losses(ctx, batch(1, 8)); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestGoRefusesTransformers: the Go engine says before joining that a
// transformers run needs the torch engine, and refuses to open its model;
// GPT and Llama runs pass the check.
func TestGoRefusesTransformers(t *testing.T) {
	op := goengine.New(nil).(engine.ModelChecker)
	var m coordinator.Model
	modelspec.SetTransformers(&m, modelspec.TransformersConfig{Vocab: 256, Context: 32, Width: 64, Layers: 2, Heads: 4})
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "seed:1@qwen3.json")
	err := op.CheckModel(context.Background(), &m)
	if !errors.Is(err, goengine.ErrNeedsTorch) || !strings.Contains(err.Error(), "seed:1@qwen3.json") || !strings.Contains(err.Error(), "--engine torch") {
		t.Fatalf("CheckModel(transformers) = %v", err)
	}
	tf, err := runmodel.NewTransformers([]byte(`{"model_type":"qwen3","vocab_size":256,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4}`), 32, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := runmodel.HostWeights(tf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := goengine.New(nil).Open(context.Background(), engine.Spec{Weights: w}); !errors.Is(err, goengine.ErrNeedsTorch) {
		t.Fatalf("Open(transformers) = %v", err)
	}
	modelspec.SetGPT(&m, small.GPT)
	if err := op.CheckModel(context.Background(), &m); err != nil {
		t.Fatalf("CheckModel(GPT) = %v", err)
	}
}
