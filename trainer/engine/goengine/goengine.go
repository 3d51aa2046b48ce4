// Package goengine is the engine of this module's own models and kernels:
// GPT and Llama (trainer/gpt, trainer/llama) on trainer/kernels, with
// DisTrO in package distro, the parameters in host memory (or behind the
// CUDA backend). It implements trainer/engine's contract.
package goengine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
)

// New is the engine of this module's own models and kernels: the model's
// tensors live in host memory (or behind the CUDA backend), and DisTrO runs
// in package distro on the CPU. be names the kernels the node built its
// models with (nil: kernels.Default()); workers is the optimizer's
// goroutines when the run's options leave it unset.
func New(be kernels.Backend) engine.Opener {
	if be == nil {
		be = kernels.Default()
	}
	return goOpener{be: be}
}

type goOpener struct{ be kernels.Backend }

func (goOpener) Name() string { return "go" }

// ErrNeedsTorch is the Go engine's refusal of a run whose model only the
// PyTorch engine builds.
var ErrNeedsTorch = errors.New("the go engine builds only GPT and Llama: join with --engine torch")

// CheckModel refuses a Transformers run: the Go engine has no
// implementation of Hugging Face's networks.
func (goOpener) CheckModel(_ context.Context, m *coordinator.Model) error {
	if m.Architecture == coordinator.ArchTransformers {
		return fmt.Errorf("engine: the run trains a Hugging Face transformers model (%s); %w",
			coordinator.FixedString(m.Checkpoint.Source.URL[:]), ErrNeedsTorch)
	}
	return nil
}

var _ engine.ModelChecker = goOpener{}

func (o goOpener) Open(ctx context.Context, s engine.Spec) (engine.Engine, error) {
	w := s.Weights
	if w.Config.Arch == coordinator.ArchTransformers {
		return nil, fmt.Errorf("engine: a Hugging Face transformers model: %w", ErrNeedsTorch)
	}
	if !w.Drawn() {
		return nil, fmt.Errorf("engine: no model to open")
	}
	// The node's host model as it is (the Go engine computes in this
	// process); weights from elsewhere are read into a model of their own.
	m, err := runmodel.FromWeights(ctx, w, o.be)
	if err != nil {
		return nil, err
	}
	cfg, err := runmodel.ConfigOf(m)
	if err != nil {
		return nil, err
	}
	opt, err := distro.NewDeMo(m.Shapes(), s.Optimizer)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("go: %s %s", o.be.Name(), kernels.PrecisionOf(o.be))
	return &goEngine{name: name, m: m, cfg: cfg, opt: opt}, nil
}

// goEngine holds a runmodel.Model and its DeMo state. mu serialises
// computation with its weights' reads only in the sense the interface
// promises: the weights are the live model (Weights.Host too), which the
// caller reads between rounds.
type goEngine struct {
	mu     sync.Mutex
	name   string
	m      runmodel.Model
	cfg    modelspec.Config
	opt    *distro.DeMo
	backup distro.Snapshot // Try's saved parameters
	trying bool
	closed bool
}

func (e *goEngine) Name() string             { return e.name }
func (e *goEngine) Config() modelspec.Config { return e.cfg }
func (e *goEngine) Shapes() [][]int          { return e.opt.Shapes() }

func (e *goEngine) forward(b engine.Batch) (engine.Losses, error) {
	if err := b.Check(e.cfg.Context()); err != nil {
		return engine.Losses{}, err
	}
	loss, err := e.m.Forward(b.Inputs, b.Targets, b.Seqs, b.SeqLen)
	if err != nil {
		return engine.Losses{}, err
	}
	return engine.Losses{Mean: loss, Seqs: e.m.SequenceLosses(b.SeqLen)}, nil
}

func (e *goEngine) Gradient(_ context.Context, b engine.Batch) (engine.Losses, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.Losses{}, engine.ErrClosed
	}
	l, err := e.forward(b)
	if err != nil {
		return engine.Losses{}, err
	}
	e.m.ZeroGrad()
	if err := e.m.Backward(); err != nil {
		return engine.Losses{}, err
	}
	return l, nil
}

func (e *goEngine) Step(_ context.Context, lr float32) (*distro.Frame, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, engine.ErrClosed
	}
	return e.opt.Step(e.m.GradTensors(), lr)
}

func (e *goEngine) Apply(_ context.Context, c *distro.Combined, lr float32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.ErrClosed
	}
	return e.opt.ApplyCombined(e.m.Tensors(), c, lr)
}

func (e *goEngine) Losses(_ context.Context, b engine.Batch) (engine.Losses, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.Losses{}, engine.ErrClosed
	}
	return e.forward(b)
}

func (e *goEngine) Try(_ context.Context, c *distro.Combined, lr float32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.ErrClosed
	}
	params := e.m.Tensors()
	e.backup.Save(params)
	e.trying = true
	if err := e.opt.ApplyCombined(params, c, lr); err != nil {
		e.restore()
		return err
	}
	return nil
}

func (e *goEngine) Undo(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engine.ErrClosed
	}
	if !e.trying {
		return engine.ErrNoUndo
	}
	e.restore()
	return nil
}

func (e *goEngine) restore() {
	e.backup.Restore(e.m.Tensors())
	e.trying = false
}

func (e *goEngine) Weights() (weights.Weights, error) {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return weights.Weights{}, engine.ErrClosed
	}
	w, err := runmodel.HostWeights(e.m)
	if err != nil {
		return w, err
	}
	read := w.Read
	w.Read = func(ctx context.Context, i, off int, dst []float32) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.closed {
			return engine.ErrClosed
		}
		return read(ctx, i, off, dst)
	}
	return w, nil
}

func (e *goEngine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.backup = distro.Snapshot{} // the buffers go with the engine
	return nil
}
