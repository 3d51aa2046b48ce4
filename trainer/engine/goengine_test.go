package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

var small = modelspec.Config{Arch: coordinator.ArchGPT, GPT: gpt.Config{Vocab: 32, Context: 8, Width: 16, Layers: 1, Heads: 2}}

func openGo(t *testing.T, seed uint64) engine.Engine {
	t.Helper()
	m, err := runmodel.New(small, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.Go(nil).Open(context.Background(), engine.Spec{Model: m,
		Optimizer: distro.Options{Chunk: 8, TopK: 4, Quantize1Bit: true, Decay: 0.9}})
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
	m, _ := e.Model(ctx)
	before := slices.Clone(m.Tensors()[0])
	if err := e.Try(ctx, []*distro.Frame{f}, 0.1); err != nil {
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
