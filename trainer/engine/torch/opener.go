package torch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
)

// Opener opens PyTorch engines: one worker process per engine.
type Opener struct {
	o    options
	mu   sync.Mutex
	open map[*eng]bool // engines not yet closed
	// described are the transformers models' tensors (names and shapes)
	// that a worker described, by config hash: a node asks before it
	// joins (CheckModel) and again to fetch the model from peers.
	described map[string]description
	// spares are workers started by Prepare and not yet opened on a model;
	// an Open with the timeout one was started for takes it.
	spares []*spare
}

// description is what describe answered for a transformers config.
type description struct {
	names  []string
	shapes [][]int
}

// spare is a prepared worker and the timeout it was started for.
type spare struct {
	w       *worker
	h       *hello
	timeout time.Duration
}

var _ engine.Preparer = (*Opener)(nil)

// Prepare starts a worker that an Open with this timeout will take (its
// processes, torch's import, a multi-device worker's ranks: seconds, more
// on a busy machine), so that opening it on a model in a run's warmup only
// moves the weights. Each call starts one; release stops it if no Open has
// taken it (trainers that share an opener may take each other's).
func (op *Opener) Prepare(ctx context.Context, timeout time.Duration) (release func(), err error) {
	w, h, err := startWorker(ctx, &op.o, workerTimeout(timeout))
	if err != nil {
		return func() {}, err
	}
	sp := &spare{w: w, h: h, timeout: workerTimeout(timeout)}
	op.mu.Lock()
	op.spares = append(op.spares, sp)
	op.mu.Unlock()
	return func() {
		op.mu.Lock()
		i := slices.Index(op.spares, sp)
		if i >= 0 {
			op.spares = slices.Delete(op.spares, i, i+1)
		}
		op.mu.Unlock()
		if i >= 0 {
			sp.w.close()
		}
	}, nil
}

// worker hands out a prepared worker started for timeout that is still
// alive, and otherwise starts one.
func (op *Opener) worker(ctx context.Context, timeout time.Duration) (*worker, *hello, error) {
	op.mu.Lock()
	i := slices.IndexFunc(op.spares, func(sp *spare) bool { return sp.timeout == timeout && sp.w.alive() })
	var sp *spare
	if i >= 0 {
		sp = op.spares[i]
		op.spares = slices.Delete(op.spares, i, i+1)
	}
	op.mu.Unlock()
	if sp != nil {
		return sp.w, sp.h, nil
	}
	return startWorker(ctx, &op.o, timeout)
}

// workerTimeout is the engine's timeout for one round's computation: the
// spec's, or the protocol's default (protocol.json's default_timeout_s).
func workerTimeout(t time.Duration) time.Duration {
	if t <= 0 {
		return defaultTimeout
	}
	return t
}

// Pids lists the worker processes of this opener's open engines.
func (op *Opener) Pids() []int {
	op.mu.Lock()
	defer op.mu.Unlock()
	var out []int
	for e := range op.open {
		out = append(out, e.w.pid())
	}
	return out
}

// RankPids lists the processes of this opener's open engines' further
// ranks (a multi-device worker's ranks 1 and up).
func (op *Opener) RankPids() []int {
	op.mu.Lock()
	defer op.mu.Unlock()
	var out []int
	for e := range op.open {
		if len(e.w.pids) > 1 {
			out = append(out, e.w.pids[1:]...)
		}
	}
	return out
}

// New returns an Opener. Nothing starts until Check or Open.
func New(opts ...Option) (*Opener, error) {
	o := options{device: "cpu", precision: "fp32", log: slog.New(slog.DiscardHandler)}
	for _, f := range opts {
		if err := f(&o); err != nil {
			return nil, err
		}
	}
	if o.kernels == nil {
		o.kernels = kernels.Default()
	}
	return &Opener{o: o, open: map[*eng]bool{}}, nil
}

// Name is "torch".
func (*Opener) Name() string { return "torch" }

// Info is what Check found: the interpreter and its torch, and the device.
type Info struct {
	Python, Torch, Device, DeviceName string
	// Devices are a multi-device worker's, one rank each (Device joins
	// them with commas).
	Devices       []string
	Memory        int64 // the smallest device's
	SDPA, Compile bool
}

func (i Info) String() string {
	s := fmt.Sprintf("torch %s (%s) on %s", i.Torch, i.Python, i.Device)
	if len(i.Devices) > 1 {
		s += fmt.Sprintf(" (%d ranks)", len(i.Devices))
	}
	if i.DeviceName != "" {
		s += " (" + i.DeviceName + ")"
	}
	return s
}

// Check starts a worker and stops it: it says, before a trainer starts any
// networking, whether this machine can run the engine as asked (a python
// with torch and numpy, the device present). Errors wrap ErrNoTorch when
// the python or its torch is missing.
func (op *Opener) Check(ctx context.Context) (Info, error) {
	w, h, err := startWorker(ctx, &op.o, 0)
	if err != nil {
		return Info{}, err
	}
	defer w.close()
	return info(w, h), nil
}

func info(w *worker, h *hello) Info {
	return Info{Python: w.python, Torch: h.Torch, Device: h.Device, DeviceName: h.DeviceName, Devices: h.Devices, Memory: h.Memory,
		SDPA: h.SDPA, Compile: h.Compile}
}

// Open starts a worker and hands it the model and the run's optimizer. A
// Transformers model's tensors are named and shaped by transformers in the
// worker (describe), which draws them from the seed unless the model holds
// them.
func (op *Opener) Open(ctx context.Context, s engine.Spec) (engine.Engine, error) {
	src := s.Weights
	cfg := src.Config
	if cfg.Arch != coordinator.ArchTransformers && !src.Drawn() {
		return nil, errors.New("torch engine: no model to open")
	}
	if s.Optimizer.Update != distro.UpdateSign {
		return nil, fmt.Errorf("torch engine: update rule %v: the engine applies sign updates only", s.Optimizer.Update)
	}
	timeout := workerTimeout(s.Timeout)
	w, h, err := op.worker(ctx, timeout)
	if err != nil {
		return nil, err
	}
	shapes := src.Shapes
	var names []string
	if cfg.Arch == coordinator.ArchTransformers {
		if names, shapes, err = describe(ctx, w, timeout, cfg.Transformers, src.JSON); err == nil && src.Drawn() {
			// Weights from peers or a directory: exactly the tensors
			// transformers builds, read in its order.
			src, err = src.InOrder(names, shapes)
		}
		if err != nil {
			w.kill()
			return nil, fmt.Errorf("torch engine: %w", err)
		}
	}
	plan, err := distro.NewPlan(shapes, s.Optimizer)
	if err != nil {
		w.kill()
		return nil, err
	}
	e := &eng{w: w, o: op.o, cfg: cfg, plan: plan, timeout: timeout, shapes: shapes, info: info(w, h),
		params: modelspec.NumParams(shapes), json: src.JSON, seed: src.Seed, names: names}
	e.name = fmt.Sprintf("torch %s on %s, %s", h.Torch, h.Device, op.o.precision)
	if h.DeviceName != "" {
		e.name = fmt.Sprintf("torch %s on %s (%s), %s", h.Torch, h.Device, h.DeviceName, op.o.precision)
	}
	placement, err := e.open(ctx, src, s.Optimizer)
	if err != nil {
		w.kill()
		return nil, err
	}
	if len(h.Devices) > 1 {
		e.name = fmt.Sprintf("%s (%d ranks, %s)", e.name, len(h.Devices), placement)
	}
	op.mu.Lock()
	op.open[e] = true
	op.mu.Unlock()
	e.opener = op
	return e, nil
}

// describe asks the worker for the names and shapes of a Transformers
// model's parameters, in transformers' order (it builds the model on the
// meta device: nothing is allocated).
func describe(ctx context.Context, w *worker, timeout time.Duration, c modelspec.TransformersConfig, json []byte) ([]string, [][]int, error) {
	a, err := w.call(ctx, timeout, &describeRequest{op: op{Op: opDescribe}, Config: transformersConfig(c, json)}, nil, tensorBlobs{})
	if err != nil {
		return nil, nil, fmt.Errorf("torch engine: %w", err)
	}
	var f struct {
		Names  []string `json:"names"`
		Shapes [][]int  `json:"shapes"`
	}
	if err := a.fields(&f); err != nil {
		return nil, nil, err
	}
	if len(f.Names) != len(f.Shapes) || len(f.Names) == 0 {
		return nil, nil, fmt.Errorf("torch engine: describe answered %d names and %d shapes", len(f.Names), len(f.Shapes))
	}
	return f.Names, f.Shapes, nil
}

// transformersConfig is what the worker's hf.build reads (the config.json),
// with the shape a multi-device worker sizes its placement by.
func transformersConfig(c modelspec.TransformersConfig, json []byte) map[string]any {
	return map[string]any{"json": string(json), "vocab": c.Vocab, "context": c.Context, "width": c.Width,
		"layers": c.Layers, "heads": c.Heads}
}

// bytesPerParam is what training a parameter holds on the device: its
// float32 value, gradient, DisTrO momentum and running mean square, and
// the copy Try saves.
const bytesPerParam = 5 * 4

// CheckModel says, before a trainer joins, whether this machine can train
// the run's model: for a Transformers run, its config.json is read and
// checked against the run, and a worker started for the check says whether
// transformers is installed, knows the config's model_type, and whether the
// model fits the device (its memory, or WithMemory's bound); a checkpoint
// directory's tensors are checked against those transformers builds. GPT
// and Llama runs are checked when loaded.
func (op *Opener) CheckModel(ctx context.Context, m *coordinator.Model) error {
	if m.Architecture != coordinator.ArchTransformers {
		return nil
	}
	tf, dir, err := runmodel.RunTransformersConfig(m)
	if err != nil {
		return err
	}
	w, h, err := startWorker(ctx, &op.o, 0)
	if err != nil {
		return err
	}
	defer w.close()
	names, shapes, err := describe(ctx, w, workerTimeout(0), tf.Config, tf.JSON)
	if err != nil {
		return err
	}
	op.remember(tf.JSON, names, shapes)
	mem, bounded := op.memory(h)
	if err := fits(modelspec.NumParams(shapes), mem, h.Device, bounded); err != nil {
		return err
	}
	if dir != "" {
		// A checkpoint directory's tensors, from its header alone: a
		// missing or misshapen one is said here, before the trainer joins,
		// rather than when the weights load in the run's warmup.
		return runmodel.CheckTransformersDir(dir, names, shapes)
	}
	return nil
}

// memory is what fits counts for the device of a worker's hello: the
// smaller of WithMemory's bound (bounded: that one) and the device's
// memory, the machine's RAM standing for a device that reports none (the
// CPU, whose training state lives there).
func (op *Opener) memory(h *hello) (memory int64, bounded bool) {
	m := h.Memory
	if m == 0 {
		m = hostMemory()
	}
	if b := op.o.memory; b > 0 && (m == 0 || b < m) {
		return b, true
	}
	return m, false
}

func (op *Opener) remember(json []byte, names []string, shapes [][]int) {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.described == nil {
		op.described = map[string]description{}
	}
	op.described[modelspec.ConfigHash(json)] = description{names: names, shapes: shapes}
}

// Describe names and shapes a transformers model's tensors as transformers
// builds them from its config: what CheckModel found, or a worker started
// to ask. The weights it is handed need only their config and config.json.
func (op *Opener) Describe(ctx context.Context, w weights.Weights) (weights.Weights, error) {
	if w.Config.Arch != coordinator.ArchTransformers {
		return weights.Weights{}, fmt.Errorf("torch engine: describe: a %s model is shaped by its own config", w.Config.Arch)
	}
	op.mu.Lock()
	d, ok := op.described[modelspec.ConfigHash(w.JSON)]
	op.mu.Unlock()
	if !ok {
		wk, _, err := startWorker(ctx, &op.o, 0)
		if err != nil {
			return weights.Weights{}, err
		}
		defer wk.close()
		d.names, d.shapes, err = describe(ctx, wk, workerTimeout(0), w.Config.Transformers, w.JSON)
		if err != nil {
			return weights.Weights{}, err
		}
		op.remember(w.JSON, d.names, d.shapes)
	}
	w.Names, w.Shapes = slices.Clone(d.names), cloneShapes(d.shapes)
	return w, nil
}

func cloneShapes(shapes [][]int) [][]int {
	out := make([][]int, len(shapes))
	for i, s := range shapes {
		out[i] = slices.Clone(s)
	}
	return out
}

var _ engine.Describer = (*Opener)(nil)

// fits says whether a model of params parameters can train on a device of
// memory bytes (0: not counted); bounded says that memory is WithMemory's
// bound, not the device's.
func fits(params int, memory int64, device string, bounded bool) error {
	need := int64(params) * bytesPerParam
	if memory == 0 || need <= memory {
		return nil
	}
	has, fix := "which has "+size(memory), "a larger device"
	if bounded {
		has, fix = "where this trainer may use "+size(memory), "a larger bound (--device-memory)"
	}
	return fmt.Errorf("torch engine: the model's %d parameters need at least %s to train on %s, %s: use a smaller config or %s",
		params, size(need), device, has, fix)
}

// size is a byte count as people read it: GiB, or MiB below one.
func size(n int64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

var _ engine.ModelChecker = (*Opener)(nil)
