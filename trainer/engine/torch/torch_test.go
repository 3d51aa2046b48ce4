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
	"syscall"
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
	ctx := context.Background()
	goOp, torchOp := openers(t)
	for _, pm := range parityModels {
		for _, quantize := range []bool{true, false} {
			for _, norm := range []bool{false, true} {
				name := fmt.Sprintf("%s 1-bit=%v rms=%v", pm.name, quantize, norm)
				o := runOptions(quantize)
				o.NormalizeRMS = norm
				g := open(t, goOp, pm.cfg, 3, o)
				tt := open(t, torchOp, pm.cfg, 3, o)
				gm, _ := hostModel(ctx, g)
				exact := newExactMomentum(planOf(t, g, o).Layouts(), o)
				r := rand.New(rand.NewPCG(5, 6))
				var sum choiceCount
				for step := range 4 {
					if _, err := g.Gradient(ctx, randomBatch(r, vocabOf(pm.cfg), 2, pm.cfg.Context())); err != nil {
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
		}
	}
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
	ctx := context.Background()
	goOp, torchOp := openers(t)
	for _, pm := range parityModels {
		for _, quantize := range []bool{true, false} {
			o := runOptions(quantize)
			fs := frames(t, pm.cfg, o, 4)
			g := open(t, goOp, pm.cfg, 3, o)
			tt := open(t, torchOp, pm.cfg, 3, o)
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
							t.Errorf("%s 1-bit=%v: tensor %d [%d] is %g on torch, %g on go, where the aggregate decodes to %.6g (%.2g of its terms' magnitudes: not rounding)",
								pm.name, quantize, i, j, got[j], want[j], value[i][j], rel)
						}
						flipped++
						continue
					}
					worst = max(worst, d/max(math.Abs(float64(want[j])), 1e-3))
				}
			}
			t.Logf("%s 1-bit=%v: %d of %d parameters took another sign (decoded within rounding of zero); the rest within %.2g relative", pm.name, quantize, flipped, total, worst)
			if worst > 1e-6 {
				t.Errorf("%s: a parameter differs by %.2g relative", pm.name, worst)
			}
		}
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

// TestWorkerKilled: a worker killed mid-run makes the next call fail with
// what happened (its exit and last output), every later call too, and no
// process is left behind.
func TestWorkerKilled(t *testing.T) {
	ctx := context.Background()
	_, torchOp := openers(t)
	pm := parityModels[0]
	e := open(t, torchOp, pm.cfg, 3, runOptions(true))
	pid := e.(*eng).Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b := randomBatch(rand.New(rand.NewPCG(1, 1)), vocabOf(pm.cfg), 2, pm.cfg.Context())
	_, err := e.Gradient(ctx, b)
	if !errors.Is(err, errWorker) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("after the worker was killed: %v, want its death explained", err)
	}
	t.Log(err)
	if _, err2 := e.Step(ctx, 0.01); !errors.Is(err2, errWorker) {
		t.Fatalf("a later call: %v, want the worker's failure again", err2)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
		t.Fatalf("the worker %d is still there", pid)
	}
}

// TestWorkerHangs: a worker that stops answering (here: stopped by a
// signal, so it cannot) is killed once the round's time is over, and the
// call says so.
func TestWorkerHangs(t *testing.T) {
	ctx := context.Background()
	_, torchOp := openers(t)
	pm := parityModels[0]
	m, _ := runmodel.New(pm.cfg, 3, nil)
	e, err := torchOp.Open(ctx, hostSpec(t, m, runOptions(true), 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	pid := e.(*eng).Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b := randomBatch(rand.New(rand.NewPCG(1, 1)), vocabOf(pm.cfg), 2, pm.cfg.Context())
	_, err = e.Gradient(ctx, b)
	if !errors.Is(err, errWorker) || !strings.Contains(err.Error(), "hangs") {
		t.Fatalf("a stopped worker: %v, want it taken for hung", err)
	}
	e.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hung worker %d was not killed", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNoTorch: a python without torch, or no python at all, is one error
// that names what to install, before anything else starts.
func TestNoTorch(t *testing.T) {
	dir := t.TempDir()
	// A python whose torch cannot be imported: a package named torch that
	// raises ImportError shadows the installed one.
	if err := os.MkdirAll(filepath.Join(dir, "shadow", "torch"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "shadow", "torch", "__init__.py"),
		[]byte("raise ImportError(\"No module named 'torch'\", name='torch')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(dir, "python-without-torch")
	script := "#!/bin/sh\nPYTHONPATH=" + filepath.Join(dir, "shadow") + " exec " + torchPython(t) + " \"$@\"\n"
	if err := os.WriteFile(py, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ python, want string }{
		{py, "lacks torch"},
		{filepath.Join(dir, "no-such-python"), "cannot be started"},
	} {
		op, err := New(WithPython(tc.python))
		if err != nil {
			t.Fatal(err)
		}
		_, err = op.Check(context.Background())
		if !errors.Is(err, ErrNoTorch) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "install") ||
			strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line naming what to install", tc.python, err)
		}
	}
}

func vocabOf(c modelspec.Config) int {
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.Vocab
	}
	return c.GPT.Vocab
}

// TestLossReportGap measures how far the engines' per-sequence losses (what
// a frame claims and witnesses check: the node's reportTolerance, 0.02 plus
// 0.5% of the loss) lie apart on the same model and batch: the Go engine in
// fp32 against the torch engine in fp32 and under bf16 autocast. The
// tolerance must hold the widest gap with room to spare, or honest trainers
// of another engine would be accused.
func TestLossReportGap(t *testing.T) {
	ctx := context.Background()
	bf16, err := New(WithPrecision("bf16"))
	if err != nil {
		t.Fatal(err)
	}
	goOp, fp32 := openers(t)
	for _, pm := range parityModels {
		g := open(t, goOp, pm.cfg, 13, runOptions(true))
		tf := open(t, fp32, pm.cfg, 13, runOptions(true))
		tb := open(t, bf16, pm.cfg, 13, runOptions(true))
		b := randomBatch(rand.New(rand.NewPCG(3, 4)), vocabOf(pm.cfg), 8, pm.cfg.Context())
		gl, err := g.Losses(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		gap := func(e engine.Engine) float64 {
			l, err := e.Losses(ctx, b)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for i := range gl.Seqs {
				worst = max(worst, math.Abs(float64(l.Seqs[i]-gl.Seqs[i])))
			}
			return worst
		}
		g32, g16 := gap(tf), gap(tb)
		t.Logf("%s: largest per-sequence gap to the Go engine: fp32 %.2g, bf16 %.2g (losses ~%.2f)", pm.name, g32, g16, gl.Mean)
		if g32 > 1e-5 {
			t.Errorf("%s: fp32 engines differ by %.2g", pm.name, g32)
		}
		if g16 > 0.005 {
			t.Errorf("%s: bf16 differs from fp32 by %.2g, a quarter of the report tolerance's floor", pm.name, g16)
		}
	}
}

// TestOutOfMemory: a batch the device cannot hold is an error naming the
// model, the batch and the device, and the worker lives on for the next
// batch. The device is the CPU of a worker whose address space is capped
// (ulimit -v) below what the batch's logits need (8.6 GB: 1024×512 tokens
// by 4096 words), and above what torch itself takes (about 3.2 GB of
// address space once the CUDA build of torch 2.x is imported).
func TestOutOfMemory(t *testing.T) {
	ctx := context.Background()
	py := filepath.Join(t.TempDir(), "python-in-6g")
	if err := os.WriteFile(py, []byte("#!/bin/sh\nulimit -v 6000000\nexec "+torchPython(t)+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	op, err := New(WithPython(py))
	if err != nil {
		t.Fatal(err)
	}
	cfg := modelspec.Config{Arch: coordinator.ArchGPT, GPT: gpt.Config{Vocab: 4096, Context: 512, Width: 32, Layers: 1, Heads: 4}}
	e := open(t, op, cfg, 1, runOptions(true))
	r := rand.New(rand.NewPCG(1, 1))
	_, err = e.Gradient(ctx, randomBatch(r, 4096, 1024, 512))
	want := "out of memory on cpu for the GPT of"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "1024×512 tokens") {
		t.Fatalf("a batch too large: %v, want %q naming the batch", err, want)
	}
	t.Log(err)
	if _, err := e.Gradient(ctx, randomBatch(r, 4096, 2, 512)); err != nil {
		t.Fatalf("the next batch after running out of memory: %v", err)
	}
}

func openRanks(t *testing.T, m runmodel.Model, o distro.Options, devices []string, placement string) *eng {
	t.Helper()
	op, err := New(WithDevices(devices), WithPlacement(placement))
	if err != nil {
		t.Fatal(err)
	}
	return openOn(t, op, m, o).(*eng)
}

// ranksCase is a model TestRanksMatchOneDevice opens on one device and
// over two ranks held as placement says.
type ranksCase struct {
	placement, name string
	model           func(t *testing.T, seed uint64) runmodel.Model
	vocab, seqLen   int
	// others are n frames of other trainers, for a round.
	others func(t *testing.T, o distro.Options, n int) []*distro.Frame
}

// ranksCases: data parallel GPT, sharded GPT and Llama (from Go weights),
// and the Qwen3 example sharded (a transformers model as its own modules,
// each rank drawing the weights from the seed; the other trainers' frames
// from one-device torch engines, the Go engine having no such model).
func ranksCases(one engine.Opener) []ranksCase {
	var out []ranksCase
	for _, c := range []struct {
		placement string
		model     int
	}{{"replicate", 1}, {"shard", 0}, {"shard", 1}} {
		pm := parityModels[c.model]
		out = append(out, ranksCase{c.placement, pm.name,
			func(t *testing.T, seed uint64) runmodel.Model { return newModel(t, pm.cfg, seed) },
			vocabOf(pm.cfg), pm.cfg.Context(),
			func(t *testing.T, o distro.Options, n int) []*distro.Frame { return frames(t, pm.cfg, o, n) }})
	}
	qwen := func(t *testing.T, seed uint64) runmodel.Model { return transformersModel(t, exampleConfigs[0], seed) }
	return append(out, ranksCase{"shard", "qwen3-tiny", qwen, 256, 32,
		func(t *testing.T, o distro.Options, n int) []*distro.Frame {
			return framesOf(t, one, func(seed uint64) runmodel.Model { return qwen(t, seed) }, 256, 32, o, n)
		}})
}

// TestRanksMatchOneDevice: a worker over two CPU ranks (gloo), data
// parallel (GPT) and sharded by FSDP2 (GPT, Llama and a transformers Qwen3:
// the parameters and gradients in per-block shards, DisTrO's state in
// shares of tiles), starts from the one-device worker's weights (a
// transformers model's drawn from the seed by every rank) and computes
// what a one-device worker computes on the same weights and batch: the same losses (each sequence on one rank), the
// gradient within float32 reduction order (two halves summed against one
// sum), the same frame but where that difference decides a near-tie at a
// tile's k-th place (each counted; every value within the bound the
// gradients' difference sets), and after a round applied, the same weights
// on every rank and as the one-device worker's. A batch of 5 splits 2+3.
// Measured here: the losses equal, the gradient within 1e-7 of its norm,
// shared values within 0.4 of the bound, and one tile of 285 a near-tie
// (how many moves with the machine: a loaded one has seen three).
func TestRanksMatchOneDevice(t *testing.T) {
	ctx := context.Background()
	_, one := openers(t)
	for _, tc := range ranksCases(one) {
		placement := tc.placement
		{
			t.Run(placement+"/"+tc.name, func(t *testing.T) {
				o := runOptions(false)
				single := openOn(t, one, tc.model(t, 5), o).(*eng)
				multi := openRanks(t, tc.model(t, 5), o, []string{"cpu", "cpu"}, placement)
				if !strings.Contains(multi.Name(), "2 ranks") {
					t.Errorf("name %q does not say the ranks", multi.Name())
				}
				if placement == "shard" && !strings.Contains(multi.Name(), "FSDP2") {
					t.Errorf("name %q does not say the parameters are sharded by FSDP2", multi.Name())
				}
				// Both start from the same weights (sent, or drawn from
				// the seed by each).
				s0, err := hostModel(ctx, single)
				if err != nil {
					t.Fatal(err)
				}
				m0, err := hostModel(ctx, multi)
				if err != nil {
					t.Fatal(err)
				}
				if runmodel.Revision(s0) != runmodel.Revision(m0) {
					t.Fatalf("opened: the ranks hold %s, the one-device worker %s", runmodel.Revision(m0), runmodel.Revision(s0))
				}
				r := rand.New(rand.NewPCG(7, 8))
				b := randomBatch(r, tc.vocab, 5, tc.seqLen)
				sl, err := single.Gradient(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				ml, err := multi.Gradient(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				lossErr := relErr(float64(ml.Mean), float64(sl.Mean))
				if lossErr > 1e-6 || len(ml.Seqs) != len(sl.Seqs) {
					t.Errorf("loss %v over %d sequences, one device %v over %d", ml.Mean, len(ml.Seqs), sl.Mean, len(sl.Seqs))
				}
				seqErr := 0.0
				for i := range sl.Seqs {
					seqErr = max(seqErr, relErr(float64(ml.Seqs[i]), float64(sl.Seqs[i])))
				}
				if seqErr > 1e-6 {
					t.Errorf("a sequence's loss differs by %.2g relative", seqErr)
				}
				worst, mg, sg := compareGradients(t, multi, single)
				if worst > 1e-5 {
					t.Errorf("a gradient tensor differs by %.3g of its norm", worst)
				}
				sf, err := single.Step(ctx, 0.02)
				if err != nil {
					t.Fatal(err)
				}
				mf, err := multi.Step(ctx, 0.02)
				if err != nil {
					t.Fatal(err)
				}
				// The two workers step on those two gradients, computed in
				// orders of their own: their frames may differ only at
				// near-ties of that difference (gradientBound).
				plan := planOf(t, single, o)
				c := compareFrames(sf, mf, gradientBound(plan.Layouts(), o, 0.02, sg, mg))
				t.Logf("loss %.2g, sequences %.2g, gradient %.2g of the norm; frames: %v", lossErr, seqErr, worst, c)
				reportBad(t, "the frames differ beyond a near-tie", c.bad)
				// A round of other trainers' frames and this one's.
				round := combine(t, plan, append(tc.others(t, o, 2), sf))
				for _, e := range []*eng{single, multi} {
					if err := e.Apply(ctx, round, 0.01); err != nil {
						t.Fatal(err)
					}
				}
				sameRanks(t, multi)
				sm, _ := hostModel(ctx, single)
				mm, err := hostModel(ctx, multi)
				if err != nil {
					t.Fatal(err)
				}
				if runmodel.Revision(sm) != runmodel.Revision(mm) {
					t.Errorf("after a round the ranks hold %s, the one-device worker %s", runmodel.Revision(mm), runmodel.Revision(sm))
				}
				weightsMatchModel(t, multi)
				// Try and Undo put every rank back.
				if err := multi.Try(ctx, round, 0.05); err != nil {
					t.Fatal(err)
				}
				if err := multi.Undo(ctx); err != nil {
					t.Fatal(err)
				}
				sameRanks(t, multi)
				if back, _ := hostModel(ctx, multi); runmodel.Revision(back) != runmodel.Revision(mm) {
					t.Errorf("Undo left %s, not %s", runmodel.Revision(back), runmodel.Revision(mm))
				}
				if placement == "shard" {
					oneSequence(t, single, multi, tc.vocab, tc.seqLen)
				}
			})
		}
	}
}

// sameRanks fails unless every rank of e holds the same weights.
func sameRanks(t *testing.T, e *eng) {
	t.Helper()
	ds, err := e.Digests(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 || ds[0] != ds[1] {
		t.Fatalf("the ranks' weights differ: %v", ds)
	}
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

// TestRankKilled: killing one rank of a two-rank worker ends the worker:
// the next call fails naming the rank, its device and how it ended, every
// later call too, and no process of the worker is left.
func TestRankKilled(t *testing.T) {
	ctx := context.Background()
	pm := parityModels[0]
	e := openRanks(t, newModel(t, pm.cfg, 3), runOptions(true), []string{"cpu", "cpu"}, "")
	pids := e.Pids()
	if len(pids) != 2 {
		t.Fatalf("pids %v, want two ranks", pids)
	}
	if err := syscall.Kill(pids[1], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b := randomBatch(rand.New(rand.NewPCG(1, 1)), vocabOf(pm.cfg), 2, pm.cfg.Context())
	_, err := e.Gradient(ctx, b)
	if !errors.Is(err, errWorker) || !strings.Contains(err.Error(), "rank 1 (cpu) stopped: signal killed") {
		t.Fatalf("after rank 1 was killed: %v, want it named", err)
	}
	t.Log(firstLine(err.Error()))
	if _, err2 := e.Step(ctx, 0.01); !errors.Is(err2, errWorker) {
		t.Fatalf("a later call: %v, want the worker's failure again", err2)
	}
	e.Close()
	for _, pid := range pids {
		gone(t, pid)
	}
}

// TestRankHangs: a rank that stops answering (stopped by a signal) holds
// the others in a collective; when the round's time is over the call fails
// naming that rank, and every rank is killed.
func TestRankHangs(t *testing.T) {
	ctx := context.Background()
	pm := parityModels[0]
	op, err := New(WithDevices([]string{"cpu", "cpu"}))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := runmodel.New(pm.cfg, 3, nil)
	ee, err := op.Open(ctx, hostSpec(t, m, runOptions(true), 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e := ee.(*eng)
	defer e.Close()
	pids := e.Pids()
	if err := syscall.Kill(pids[1], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b := randomBatch(rand.New(rand.NewPCG(1, 1)), vocabOf(pm.cfg), 2, pm.cfg.Context())
	_, err = e.Gradient(ctx, b)
	if !errors.Is(err, errWorker) || !strings.Contains(err.Error(), "rank 1 (cpu) hangs") {
		t.Fatalf("a stopped rank: %v, want it named", err)
	}
	t.Log(firstLine(err.Error()))
	e.Close()
	for _, pid := range pids {
		gone(t, pid)
	}
}

// oneSequence: FSDP gathers every block's parameters with all ranks, so a
// sharded rank whose share of the batch is empty (one sequence over two
// ranks) still takes part in the forward and backward passes: the call
// completes with the one-device worker's loss and gradient (single and
// multi hold the same weights).
func oneSequence(t *testing.T, single, multi *eng, vocab, seqLen int) {
	t.Helper()
	ctx := context.Background()
	b := randomBatch(rand.New(rand.NewPCG(9, 10)), vocab, 1, seqLen)
	sl, err := single.Gradient(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	ml, err := multi.Gradient(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	// One rank computes the whole batch: the one-device arithmetic but for
	// its thread count (the bound above).
	if relErr(float64(ml.Mean), float64(sl.Mean)) > 1e-6 || len(ml.Seqs) != 1 || relErr(float64(ml.Seqs[0]), float64(sl.Seqs[0])) > 1e-6 {
		t.Errorf("one sequence: loss %v %v, one device %v %v", ml.Mean, ml.Seqs, sl.Mean, sl.Seqs)
	}
	if worst, _, _ := compareGradients(t, multi, single); worst > 1e-5 {
		t.Errorf("one sequence: a gradient tensor differs by %.3g of its norm", worst)
	}
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
