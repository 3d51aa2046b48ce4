package torch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/internal/syncbuf"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/goengine"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// The engines are compared on models small enough for a loaded 2-core
// machine, in the shapes that exercise every path: GPT; Llama with grouped
// query attention and an untied head; Llama with plain attention and a tied
// head.
var parityModels = []struct {
	name string
	cfg  modelspec.Config
}{
	{"gpt", modelspec.Config{Arch: coordinator.ArchGPT, GPT: gpt.Config{Vocab: 96, Context: 24, Width: 48, Layers: 2, Heads: 4}}},
	{"llama-gqa", modelspec.Config{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 96, Context: 24, Width: 64, Layers: 2,
		Heads: 4, KVHeads: 2, Intermediate: 96, RopeTheta: 10000}}},
	{"llama-tied", modelspec.Config{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 64, Context: 16, Width: 32, Layers: 2,
		Heads: 4, KVHeads: 4, Intermediate: 64, RopeTheta: 500000, TiedHead: true}}},
}

// runOptions are DisTrO's options as a run sets them (modelspec.Distro),
// with small tiles so that every tensor has several.
func runOptions(quantize bool) distro.Options {
	return distro.Options{Chunk: 16, TopK: 8, Quantize1Bit: quantize, RiceIndices: true, Decay: 0.999, WeightDecay: 0.1,
		ClipGradNorm: 1, Workers: 2}
}

// torchPython is the python the engine runs its worker under by default
// (PSYCHE_PYTHON, else the environment scripts/setup-torch installs), for
// tests that wrap it.
func torchPython(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PSYCHE_PYTHON"); p != "" {
		return p
	}
	if p := SetupPython(); p != "" {
		return p
	}
	t.Fatal("no python for the worker: run bash scripts/setup-torch (scripts/test does), or set PSYCHE_PYTHON")
	return ""
}

func openers(t *testing.T) (engine.Opener, *Opener) {
	t.Helper()
	op, err := New()
	if err != nil {
		t.Fatal(err)
	}
	return goengine.New(nil), op
}

func open(t *testing.T, op engine.Opener, cfg modelspec.Config, seed uint64, o distro.Options) engine.Engine {
	t.Helper()
	return openOn(t, op, newModel(t, cfg, seed), o)
}

// newModel is a GPT or Llama model of cfg drawn from seed.
func newModel(t *testing.T, cfg modelspec.Config, seed uint64) runmodel.Model {
	t.Helper()
	m, err := runmodel.New(cfg, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// openOn opens an engine of op on m (closed when the test ends).
// hostSpec is the Spec of a model in this process.
func hostSpec(tb testing.TB, m runmodel.Model, o distro.Options, timeout time.Duration) engine.Spec {
	tb.Helper()
	w, err := runmodel.HostWeights(m)
	if err != nil {
		tb.Fatal(err)
	}
	return engine.Spec{Weights: w, Optimizer: o, Timeout: timeout}
}

func openOn(t *testing.T, op engine.Opener, m runmodel.Model, o distro.Options) engine.Engine {
	t.Helper()
	e, err := op.Open(context.Background(), hostSpec(t, m, o, 0))
	if err != nil {
		if errors.Is(err, ErrNoTorch) {
			t.Fatalf("%v\n(the tests need the engine's environment: bash scripts/setup-torch; scripts/test installs it)", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// planOf is the plan a node holds for e's model under o: what checks,
// sizes and combines a round's frames before an engine applies them.
func planOf(t *testing.T, e engine.Engine, o distro.Options) *distro.Plan {
	t.Helper()
	p, err := distro.NewPlan(e.Shapes(), o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// combine is a round's aggregate as a node hands it to its engine.
func combine(t *testing.T, p *distro.Plan, fs []*distro.Frame) *distro.Combined {
	t.Helper()
	c, err := p.Combine(fs)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randomBatch(r *rand.Rand, vocab, seqs, seqLen int) engine.Batch {
	b := engine.Batch{Seqs: seqs, SeqLen: seqLen, Inputs: make([]uint32, seqs*seqLen), Targets: make([]uint32, seqs*seqLen)}
	for i := range b.Inputs {
		b.Inputs[i], b.Targets[i] = uint32(r.IntN(vocab)), uint32(r.IntN(vocab))
	}
	return b
}

func relErr(a, b float64) float64 { return math.Abs(a-b) / max(math.Abs(b), 1e-30) }

// gradErr is the largest difference of two gradient tensors relative to
// the norm of want.
func gradErr(got, want []float32) float64 {
	var norm, worst float64
	for i := range want {
		norm += float64(want[i]) * float64(want[i])
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	return worst / max(math.Sqrt(norm), 1e-30)
}

// compareGradients fetches the gradients got and want each keep and
// returns gradErr's largest value over their tensors, with both.
func compareGradients(t *testing.T, got, want *eng) (worst float64, gg, wg [][]float32) {
	t.Helper()
	ctx := context.Background()
	var err error
	if wg, err = want.Gradients(ctx); err != nil {
		t.Fatal(err)
	}
	if gg, err = got.Gradients(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range wg {
		worst = max(worst, gradErr(gg[i], wg[i]))
	}
	return worst, gg, wg
}

// TestGradientParity: on the same weights and batch, in fp32, the torch
// engine's loss and each sequence's loss are within 1e-5 relative of the
// Go engine's, and every gradient tensor within 1e-5 of its norm.
func TestGradientParity(t *testing.T) {
	ctx := context.Background()
	goOp, torchOp := openers(t)
	for _, pm := range parityModels {
		t.Run(pm.name, func(t *testing.T) {
			g := open(t, goOp, pm.cfg, 7, runOptions(true))
			tt := open(t, torchOp, pm.cfg, 7, runOptions(true))
			r := rand.New(rand.NewPCG(1, 2))
			for _, seqLen := range []int{pm.cfg.Context(), pm.cfg.Context() / 2} {
				b := randomBatch(r, vocabOf(pm.cfg), 3, seqLen)
				gl, err := g.Gradient(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				tl, err := tt.Gradient(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				if e := relErr(float64(tl.Mean), float64(gl.Mean)); e > 1e-5 {
					t.Errorf("t=%d: loss %v, go %v (relative error %.2g)", seqLen, tl.Mean, gl.Mean, e)
				}
				for i := range gl.Seqs {
					if e := relErr(float64(tl.Seqs[i]), float64(gl.Seqs[i])); e > 1e-5 {
						t.Errorf("t=%d: sequence %d's loss %v, go %v", seqLen, i, tl.Seqs[i], gl.Seqs[i])
					}
				}
				gm, _ := hostModel(ctx, g)
				tg, err := tt.(*eng).Gradients(ctx)
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for i, want := range gm.GradTensors() {
					worst = max(worst, gradErr(tg[i], want))
				}
				if worst > 1e-5 {
					t.Errorf("t=%d: a gradient tensor differs by %.3g of its norm", seqLen, worst)
				}
				t.Logf("t=%d: loss error %.2g, worst gradient error %.2g of the norm", seqLen, relErr(float64(tl.Mean), float64(gl.Mean)), worst)
			}
		})
	}
}

// TestSeededHash: a model opened on the torch engine and copied back out
// is the model that went in (so a seeded model's hash is the Go engine's),
// and its weights read a range at a time hash and save as that model.
func TestSeededHash(t *testing.T) {
	_, torchOp := openers(t)
	for _, pm := range parityModels {
		want, _ := runmodel.New(pm.cfg, 11, nil)
		e := open(t, torchOp, pm.cfg, 11, runOptions(true))
		got, err := hostModel(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		if runmodel.Revision(got) != runmodel.Revision(want) {
			t.Errorf("%s: hash %s after the round trip, %s before", pm.name, runmodel.Revision(got), runmodel.Revision(want))
		}
		weightsMatchModel(t, e)
	}
}

// TestFrameParity: fed the same gradient over several steps, the torch
// engine's frames select the Go engine's index sets with the same signs
// and (unquantized) values. The two compute the DCT in float32 by other
// algorithms (Go's fast transform, torch's matrix products), so a tile
// whose k-th and (k+1)-th coefficients lie within the rounding of the two
// may choose either: such near-ties are counted, and every other tile must
// match. What the rounding may move is bounded per coefficient against the
// momentum computed exactly (exactMomentum), and both engines' values must
// lie within that bound of it.
func TestFrameParity(t *testing.T) {
	goOp, torchOp := openers(t)
	for _, pm := range parityModels {
		for _, quantize := range []bool{true, false} {
			for _, norm := range []bool{false, true} {
				name := fmt.Sprintf("%s 1-bit=%v rms=%v", pm.name, quantize, norm)
				o := runOptions(quantize)
				o.NormalizeRMS = norm
				frameParity(t, name, goOp, torchOp, pm.cfg, o, 4)
			}
		}
	}
}

// TestFrameParityAcrossChunks is TestFrameParity on a model whose embedding
// and head the worker's DisTrO takes in two pieces each on a CPU (a piece is
// 2^20 coefficients there: 128 of their 256 rows of 16×16 tiles), as it takes
// every large tensor of a real model: a tile's coefficients, and so the
// frame, must not depend on which piece the tile fell in, nor the RMS
// normalization's running state.
func TestFrameParityAcrossChunks(t *testing.T) {
	goOp, torchOp := openers(t)
	o := runOptions(false)
	o.NormalizeRMS = true
	frameParity(t, "llama-wide rms", goOp, torchOp, wideModel, o, 2)
}

// wideModel's embedding and head are 4096×512: two of the worker's pieces
// each on a CPU.
var wideModel = modelspec.Config{Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 4096, Context: 8, Width: 512,
	Layers: 1, Heads: 4, KVHeads: 2, Intermediate: 128, RopeTheta: 10000}}

// frameParity steps a Go and a torch engine of cfg on the same gradients
// and fails on any tile whose frames differ beyond what rounding allows.
func frameParity(t *testing.T, name string, goOp, torchOp engine.Opener, cfg modelspec.Config, o distro.Options, steps int) {
	t.Helper()
	ctx := context.Background()
	g := open(t, goOp, cfg, 3, o)
	tt := open(t, torchOp, cfg, 3, o)
	gm, _ := hostModel(ctx, g)
	exact := newExactMomentum(planOf(t, g, o).Layouts(), o)
	r := rand.New(rand.NewPCG(5, 6))
	var sum choiceCount
	for step := range steps {
		if _, err := g.Gradient(ctx, randomBatch(r, vocabOf(cfg), 2, cfg.Context())); err != nil {
			t.Fatal(err)
		}
		grads := gm.GradTensors()
		if err := tt.(*eng).SetGradients(ctx, grads); err != nil {
			t.Fatal(err)
		}
		lr := float32(0.01) * float32(step+1)
		gf, err := g.Step(ctx, lr)
		if err != nil {
			t.Fatal(err)
		}
		tf, err := tt.Step(ctx, lr)
		if err != nil {
			t.Fatal(err)
		}
		exact.step(grads, lr)
		sum.add(exact.compare(gf, tf))
	}
	t.Logf("%s: %v", name, sum)
	reportBad(t, name, sum.bad)
}

// frames makes n frames of distinct gradients with the Go engine.
func frames(t *testing.T, cfg modelspec.Config, o distro.Options, n int) []*distro.Frame {
	return framesOf(t, goengine.New(nil), func(seed uint64) runmodel.Model { return newModel(t, cfg, seed) },
		vocabOf(cfg), cfg.Context(), o, n)
}

// framesOf makes n frames of distinct gradients with engines of op, each on
// a model of its own seed.
func framesOf(t *testing.T, op engine.Opener, model func(seed uint64) runmodel.Model, vocab, seqLen int, o distro.Options, n int) []*distro.Frame {
	ctx := context.Background()
	var out []*distro.Frame
	r := rand.New(rand.NewPCG(9, uint64(n)))
	for i := range n {
		g := openOn(t, op, model(uint64(20+i)), o)
		if _, err := g.Gradient(ctx, randomBatch(r, vocab, 2, seqLen)); err != nil {
			t.Fatal(err)
		}
		f, err := g.Step(ctx, 0.02)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// TestApplyParity: the same round applied by both engines to the same
// weights. The torch engine inverts the DCT as a matrix product, Go by its
// fast transform, so an element whose decoded value lies within the two's
// rounding of zero (nearZero of its terms' magnitudes, against the inverse
// in float64: decodedF64) may take the other sign and move by 2·lr where
// the other engine's does not: such elements are counted, and every other
// element is equal to the float32 rounding of the update.
func TestApplyParity(t *testing.T) {
	goOp, torchOp := openers(t)
	for _, pm := range parityModels {
		for _, quantize := range []bool{true, false} {
			applyParity(t, fmt.Sprintf("%s 1-bit=%v", pm.name, quantize), goOp, torchOp, pm.cfg, runOptions(quantize))
		}
	}
}

// TestApplyParityAcrossChunks is TestApplyParity on wideModel, whose
// embedding and head the worker decodes in two pieces each: a round's
// entries are split between the pieces by tile, and no tile's update may
// depend on the split.
func TestApplyParityAcrossChunks(t *testing.T) {
	goOp, torchOp := openers(t)
	applyParity(t, "llama-wide", goOp, torchOp, wideModel, runOptions(false))
}

// applyParity applies the same round of four frames with a Go and a torch
// engine of cfg and compares the weights.
func applyParity(t *testing.T, name string, goOp, torchOp engine.Opener, cfg modelspec.Config, o distro.Options) {
	t.Helper()
	ctx := context.Background()
	fs := frames(t, cfg, o, 4)
	g := open(t, goOp, cfg, 3, o)
	tt := open(t, torchOp, cfg, 3, o)
	const lr = 0.01
	plan := planOf(t, g, o)
	comb := combine(t, plan, fs)
	for _, e := range []engine.Engine{g, tt} {
		if err := e.Apply(ctx, comb, lr); err != nil {
			t.Fatal(err)
		}
	}
	value, scale := decodedF64(plan, comb)
	gm, _ := hostModel(ctx, g)
	tm, err := hostModel(ctx, tt)
	if err != nil {
		t.Fatal(err)
	}
	total, flipped, worst := 0, 0, 0.0
	for i, want := range gm.Tensors() {
		got := tm.Tensors()[i]
		for j := range want {
			total++
			d := math.Abs(float64(got[j] - want[j]))
			if d > lr/2 {
				if rel := math.Abs(value[i][j]) / scale[i][j]; !(rel <= nearZero) {
					t.Errorf("%s: tensor %d [%d] is %g on torch, %g on go, where the aggregate decodes to %.6g (%.2g of its terms' magnitudes: not rounding)",
						name, i, j, got[j], want[j], value[i][j], rel)
				}
				flipped++
				continue
			}
			worst = max(worst, d/max(math.Abs(float64(want[j])), 1e-3))
		}
	}
	t.Logf("%s: %d of %d parameters took another sign (decoded within rounding of zero); the rest within %.2g relative", name, flipped, total, worst)
	if worst > 1e-6 {
		t.Errorf("%s: a parameter differs by %.2g relative", name, worst)
	}
}

// TestDeterministicApply: two torch engines that apply the same rounds to
// the same model hold identical weights, bit for bit.
func TestDeterministicApply(t *testing.T) {
	ctx := context.Background()
	_, torchOp := openers(t)
	pm := parityModels[1]
	o := runOptions(true)
	fs := frames(t, pm.cfg, o, 3)
	var hashes []string
	for range 2 {
		e := open(t, torchOp, pm.cfg, 3, o)
		plan := planOf(t, e, o)
		for r := range 3 {
			if err := e.Apply(ctx, combine(t, plan, fs[r:]), 0.01); err != nil {
				t.Fatal(err)
			}
		}
		m, err := hostModel(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, runmodel.Revision(m))
	}
	if hashes[0] != hashes[1] {
		t.Fatalf("the same rounds gave weights %s and %s", hashes[0], hashes[1])
	}
}

// TestTryUndo: Try moves the model, Undo puts back every bit, and the kept
// gradient survives both; a second try after an undo (what a witness's
// next result does) and a try after an apply (the parameters moved on)
// are undone to the model as it then is. The worker keeps what a try
// replaced in a file; where no file can be written (here: a file size
// limit of 1 KiB) it keeps it in memory, says so, and undoes the same.
func TestTryUndo(t *testing.T) {
	for _, tc := range []struct {
		name, ulimit, says string
	}{
		{"in a file", "", ""},
		{"in memory", "ulimit -f 2\n", "kept in memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			py := filepath.Join(t.TempDir(), "python")
			if err := os.WriteFile(py, []byte("#!/bin/sh\n"+tc.ulimit+"exec "+torchPython(t)+" \"$@\"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			var logs syncbuf.Buffer
			op, err := New(WithPython(py), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			tryUndo(t, op)
			if got := logs.String(); tc.says != "" && !strings.Contains(got, tc.says) {
				t.Errorf("the worker did not say %q:\n%s", tc.says, got)
			} else if tc.says == "" && strings.Contains(got, "kept in memory") {
				t.Errorf("the undo was kept in memory where a file could be written:\n%s", got)
			}
		})
	}
}

func tryUndo(t *testing.T, op *Opener) {
	ctx := context.Background()
	pm := parityModels[0]
	o := runOptions(true)
	e := open(t, op, pm.cfg, 3, o)
	b := randomBatch(rand.New(rand.NewPCG(1, 1)), vocabOf(pm.cfg), 2, pm.cfg.Context())
	if _, err := e.Gradient(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := e.Undo(ctx); !errors.Is(err, engine.ErrNoUndo) {
		t.Fatalf("Undo before Try: %v, want ErrNoUndo", err)
	}
	plan := planOf(t, e, o)
	fs := frames(t, pm.cfg, o, 2)
	one, other := combine(t, plan, fs[:1]), combine(t, plan, fs[1:])
	losses := func() engine.Losses {
		t.Helper()
		l, err := e.Losses(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// tryThenUndo tries c and undoes it, which must leave the losses at want.
	tryThenUndo := func(what string, c *distro.Combined, want engine.Losses) {
		t.Helper()
		if err := e.Try(ctx, c, 0.05); err != nil {
			t.Fatal(err)
		}
		if moved := losses(); moved.Mean == want.Mean {
			t.Fatalf("%s: Try did not change the model", what)
		}
		if err := e.Undo(ctx); err != nil {
			t.Fatal(err)
		}
		if after := losses(); after.Mean != want.Mean || !slices.Equal(after.Seqs, want.Seqs) {
			t.Fatalf("%s: after Undo the loss is %v, before Try %v", what, after.Mean, want.Mean)
		}
	}
	before := losses()
	tryThenUndo("a first try", one, before)
	tryThenUndo("a second try", other, before)
	if err := e.Apply(ctx, one, 0.05); err != nil {
		t.Fatal(err)
	}
	applied := losses()
	if applied.Mean == before.Mean {
		t.Fatal("Apply did not change the model")
	}
	tryThenUndo("a try after an apply", other, applied)
	if _, err := e.Step(ctx, 0.01); err != nil {
		t.Fatalf("the gradient did not survive Try and Undo: %v", err)
	}
}

func vocabOf(c modelspec.Config) int {
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.Vocab
	}
	return c.GPT.Vocab
}

// gone waits until process pid has ended (a zombie counts as ended: its
// parent, gone too, cannot reap it where init does not), at most a minute.
func gone(t *testing.T, pid int) {
	t.Helper()
	for range 1200 {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("process %d is still there", pid)
}

// hostModel is a model in this process holding e's current weights, read
// from the engine a tensor at a time: what the tests compare with the Go
// engine's model.
func hostModel(ctx context.Context, e engine.Engine) (runmodel.Model, error) {
	w, err := e.Weights()
	if err != nil {
		return nil, err
	}
	return runmodel.FromWeights(ctx, w, nil)
}
