package torch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// eng is one worker holding one model.
type eng struct {
	mu      sync.Mutex // one request at a time
	w       *worker
	o       options
	cfg     modelspec.Config
	plan    *distro.Plan
	shapes  [][]int
	params  int
	name    string
	info    Info
	timeout time.Duration
	closed  bool
	broken  error // the worker's failure: every later call returns it
	opener  *Opener
	// A transformers model's config.json, the seed it was drawn from (when
	// the worker drew it) and its tensors' names as the worker reported
	// them (nil: GPT or Llama).
	json  []byte
	seed  uint64
	names []string
}

var _ engine.Engine = (*eng)(nil)

func (e *eng) Name() string             { return e.name }
func (e *eng) Config() modelspec.Config { return e.cfg }
func (e *eng) Shapes() [][]int          { return cloneShapes(e.shapes) }

// Info is what the worker said of itself.
func (e *eng) Info() Info { return e.info }

// Probe is what benchmarks read of a torch engine besides the engine
// contract: the worker's process (its resident memory, its device memory
// under nvidia-smi) and what torch counts on its device.
type Probe interface {
	Pid() int
	Memory(ctx context.Context, reset bool) (Memory, error)
}

var _ Probe = (*eng)(nil)

// Pid is the worker process's id (rank 0's, on several devices).
func (e *eng) Pid() int { return e.w.pid() }

// bulkTimeout bounds a call that moves every parameter (open, Model): a
// minute plus a second per 20M parameters, at least the round's.
func (e *eng) bulkTimeout() time.Duration {
	return max(e.timeout, time.Minute+time.Duration(e.params/20_000_000)*time.Second)
}

// do sends one request under the engine's lock: its blobs, then tensors
// (float32 blobs read and encoded as they are written).
func (e *eng) do(ctx context.Context, timeout time.Duration, req request, blobs [][]byte, tensors ...tensorBlobs) (*answer, error) {
	if e.closed {
		return nil, engine.ErrClosed
	}
	if e.broken != nil {
		return nil, e.broken
	}
	var t tensorBlobs
	if len(tensors) > 0 {
		t = tensors[0]
	}
	a, err := e.w.call(ctx, timeout, req, blobs, t)
	if err != nil {
		if errors.Is(err, errWorker) {
			e.broken = err
		}
		return nil, e.explain(err, req)
	}
	return a, nil
}

// explain turns the worker's out-of-memory refusal into an error that
// names the model, the batch and the device.
func (e *eng) explain(err error, req request) error {
	var we *workerError
	if !errors.As(err, &we) || we.kind != kindOOM {
		return err
	}
	what := fmt.Sprintf("the %s model of %d parameters", modelspec.ArchTitle(e.cfg.Arch), e.params)
	if b, ok := req.(*batchRequest); ok {
		what += fmt.Sprintf(" at a batch of %d×%d tokens", b.B, b.T)
	}
	return fmt.Errorf("torch engine: out of memory on %s for %s (%s): use a smaller model or batch, bf16, or a device with more memory",
		e.info.Device, what, firstLine(we.msg))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// ModelConfig is one of psyche's own models (GPT or Llama) as the worker's
// models.build reads it: its architecture's name and its shape, every value
// given (the norms' ε too: the worker fills in no default of its own).
// Tests and benchmarks that drive the worker's models directly use it.
func ModelConfig(c modelspec.Config) (arch string, config map[string]any) {
	if c.Arch == coordinator.ArchLlama {
		l := c.Llama
		return modelspec.ArchName(coordinator.ArchLlama), map[string]any{"vocab": l.Vocab, "context": l.Context, "width": l.Width, "layers": l.Layers,
			"heads": l.Heads, "kv_heads": l.KVHeads, "intermediate": l.Intermediate, "rope_theta": l.RopeTheta,
			"tied_head": l.TiedHead, "norm_eps": l.Eps()}
	}
	g := c.GPT
	return modelspec.ArchName(coordinator.ArchGPT), map[string]any{"vocab": g.Vocab, "context": g.Context, "width": g.Width, "layers": g.Layers, "heads": g.Heads,
		"norm_eps": kernels.LayerNormEps}
}

func (e *eng) open(ctx context.Context, src weights.Weights, o distro.Options) (string, error) {
	arch, mc := ModelConfig(e.cfg)
	var layouts []layout
	for _, l := range e.plan.Layouts() {
		layouts = append(layouts, layout{Shape: l.Shape, Outer: l.Outer, Rows: l.Rows, Cols: l.Cols, TileH: l.TileH, TileW: l.TileW, K: l.K})
	}
	var seed *uint64
	if e.cfg.Arch == coordinator.ArchTransformers {
		arch, mc = modelspec.ArchName(coordinator.ArchTransformers), transformersConfig(e.cfg.Transformers, e.json)
		if !src.Drawn() {
			seed = &e.seed
		}
	}
	h := &openRequest{op: op{Op: opOpen}, Arch: arch, Config: mc, Seed: seed, Layouts: layouts, Shapes: e.shapes,
		Distro: distroOptions{Decay: o.Decay, WeightDecay: o.WeightDecay, Clip: o.ClipGradNorm,
			Quantize: o.Quantize1Bit, NormalizeRMS: o.NormalizeRMS, MaxValue: distro.MaxValue},
		Precision: e.o.precision, Compile: e.o.compile, Placement: e.o.placement}
	// The weights follow one tensor a blob, each read and encoded a chunk
	// at a time as the request is written.
	var tensors tensorBlobs
	if src.Drawn() {
		tensors.sizes = make([]int, len(e.shapes))
		for i, sh := range e.shapes {
			tensors.sizes[i] = modelspec.Size(sh)
		}
		tensors.read = func(i, off int, dst []float32) error { return src.Read(ctx, i, off, dst) }
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	a, err := e.do(ctx, e.bulkTimeout(), h, nil, tensors)
	if err != nil {
		return "", err
	}
	var f struct {
		Placement string `json:"placement"`
	}
	return f.Placement, a.fields(&f)
}

func (e *eng) batchCall(ctx context.Context, name opName, b engine.Batch) (engine.Losses, error) {
	if err := b.Check(e.cfg.Context()); err != nil {
		return engine.Losses{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	a, err := e.do(ctx, e.timeout, &batchRequest{op: op{Op: name}, B: b.Seqs, T: b.SeqLen}, [][]byte{u32Bytes(b.Inputs), u32Bytes(b.Targets)})
	if err != nil {
		return engine.Losses{}, err
	}
	var f struct {
		Loss float32 `json:"loss"`
	}
	if err := a.fields(&f); err != nil {
		return engine.Losses{}, err
	}
	if len(a.blobs) != 1 {
		return engine.Losses{}, fmt.Errorf("torch engine: %s answered %d blobs, want 1", name, len(a.blobs))
	}
	seqs, err := f32s(a.blobs[0])
	if err == nil && len(seqs) != b.Seqs {
		err = fmt.Errorf("torch engine: %d sequence losses for %d sequences", len(seqs), b.Seqs)
	}
	if err != nil {
		return engine.Losses{}, err
	}
	return engine.Losses{Mean: f.Loss, Seqs: seqs}, nil
}

func (e *eng) Gradient(ctx context.Context, b engine.Batch) (engine.Losses, error) {
	return e.batchCall(ctx, opGradient, b)
}

func (e *eng) Losses(ctx context.Context, b engine.Batch) (engine.Losses, error) {
	return e.batchCall(ctx, opLosses, b)
}

func (e *eng) Step(ctx context.Context, lr float32) (*distro.Frame, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, err := e.do(ctx, e.timeout, &lrRequest{op: op{Op: opStep}, LR: lr}, nil)
	if err != nil {
		var we *workerError
		if errors.As(err, &we) && we.kind == kindNonFinite {
			return nil, fmt.Errorf("%w (%s)", distro.ErrNonFinite, we.msg)
		}
		return nil, err
	}
	n := len(e.shapes)
	if len(a.blobs) != 2*n {
		return nil, fmt.Errorf("torch engine: step answered %d blobs, want %d", len(a.blobs), 2*n)
	}
	idx, vals := make([][]uint32, n), make([][]float32, n)
	for i := range n {
		if idx[i], err = u32s(a.blobs[2*i]); err != nil {
			return nil, err
		}
		if vals[i], err = f32s(a.blobs[2*i+1]); err != nil {
			return nil, err
		}
	}
	return e.plan.FrameOf(idx, vals)
}

// combined is a round's aggregate as the worker reads it: per tensor, the
// tiles, the indices within them and the values. The worker trusts their
// order and range, so they are checked here (the Go engine's own check).
func (e *eng) combined(c *distro.Combined) ([][]byte, error) {
	if err := e.plan.CheckCombined(c); err != nil {
		return nil, err
	}
	blobs := make([][]byte, 0, 3*len(c.Tensors))
	for _, t := range c.Tensors {
		blobs = append(blobs, u32Bytes(t.Tiles), u32Bytes(t.Index), f32Bytes(t.Values))
	}
	return blobs, nil
}

func (e *eng) Apply(ctx context.Context, c *distro.Combined, lr float32) error {
	return e.applyOp(ctx, opApply, c, lr)
}

func (e *eng) Try(ctx context.Context, c *distro.Combined, lr float32) error {
	return e.applyOp(ctx, opTry, c, lr)
}

// applyOp sends an aggregate to the worker under op (apply or try).
func (e *eng) applyOp(ctx context.Context, name opName, c *distro.Combined, lr float32) error {
	blobs, err := e.combined(c)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err = e.do(ctx, e.timeout, &lrRequest{op: op{Op: name}, LR: lr}, blobs)
	return err
}

func (e *eng) Undo(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err := e.do(ctx, e.timeout, bare(opUndo), nil)
	var we *workerError
	if errors.As(err, &we) && we.kind == kindInput {
		return engine.ErrNoUndo
	}
	return err
}

// tensors fetches what op returns: one float32 blob per parameter tensor.
func (e *eng) tensors(ctx context.Context, name opName) ([][]float32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, err := e.do(ctx, e.bulkTimeout(), bare(name), nil)
	if err != nil {
		return nil, err
	}
	if len(a.blobs) != len(e.shapes) {
		return nil, fmt.Errorf("torch engine: %s answered %d tensors, the model has %d", name, len(a.blobs), len(e.shapes))
	}
	out := make([][]float32, len(a.blobs))
	for i, b := range a.blobs {
		if out[i], err = f32s(b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Memory is what the worker's device holds for the engine, in bytes: now,
// and at its peak (since the last call with reset; 0 on the CPU, where
// torch does not count).
type Memory struct {
	Allocated int64 `json:"memory"`
	Peak      int64 `json:"peak"`
}

// Memory reports the device memory the engine holds.
func (e *eng) Memory(ctx context.Context, reset bool) (Memory, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, err := e.do(ctx, e.timeout, &statsRequest{op: op{Op: opStats}, Reset: reset}, nil)
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	return m, a.fields(&m)
}

// Weights are the parameters on the worker's device, read a range at a time
// (the worker's read op; sharded ranks gather the tensor read).
func (e *eng) Weights() (weights.Weights, error) {
	return weights.Weights{Config: e.cfg, Shapes: cloneShapes(e.shapes), Names: slices.Clone(e.names), JSON: e.json,
		Seed: e.seed, Read: e.read}, nil
}

func (e *eng) read(ctx context.Context, i, off int, dst []float32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, err := e.do(ctx, e.bulkTimeout(), &readRequest{op: op{Op: opRead}, Tensor: i, Offset: off, Count: len(dst)}, nil)
	if err != nil {
		return err
	}
	if len(a.blobs) != 1 || len(a.blobs[0]) != 4*len(dst) {
		return fmt.Errorf("torch engine: a read of %d values answered %d blobs", len(dst), len(a.blobs))
	}
	return f32Into(dst, a.blobs[0])
}

// Model is a host copy of the engine's model, every tensor in one answer
// (the worker's params op): tests check the weights read a range at a
// time against it, and a benchmark the memory the two paths take.
func (e *eng) Model(ctx context.Context) (runmodel.Model, error) {
	ts, err := e.tensors(ctx, opParams)
	if err != nil {
		return nil, err
	}
	w, err := e.Weights()
	if err != nil {
		return nil, err
	}
	w.Read = sliceBlobs(ts).readCtx
	return runmodel.FromWeights(ctx, w, e.o.kernels)
}

func (e *eng) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if e.opener != nil {
		e.opener.mu.Lock()
		delete(e.opener.open, e)
		e.opener.mu.Unlock()
	}
	return e.w.close()
}
