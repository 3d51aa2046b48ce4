package torch

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

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
	want := "out of memory on cpu for the GPT model of"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "1024×512 tokens") {
		t.Fatalf("a batch too large: %v, want %q naming the batch", err, want)
	}
	t.Log(err)
	if _, err := e.Gradient(ctx, randomBatch(r, 4096, 2, 512)); err != nil {
		t.Fatalf("the next batch after running out of memory: %v", err)
	}
}
