// Package torch owns the PyTorch engine: psyche starts a Python worker
// process (its code is embedded in this package, worker/*.py) that holds
// the model's parameters, gradients and DisTrO state on a torch device (the
// CPU, a CUDA or ROCm GPU, Apple's mps) and does the arithmetic there. The
// worker needs torch (2.6 or newer) and numpy: scripts/setup-torch installs
// the pinned versions where SetupPython finds them. Per round, what
// crosses the pipe is the batch's tokens, the frame's entries, the round's
// combined coefficients (distro.Plan.Combine: the aggregation rule runs in
// Go, once, for every engine) and losses; the parameters cross only when a
// model is opened or copied out for a checkpoint.
//
// A worker that dies, hangs past the round's time or breaks the protocol
// makes every later call fail with its exit status and last output (the
// node then stops, and the trainer exits non-zero); the worker's own
// refusals (out of device memory, a gradient that is not finite) leave it
// running.
package torch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
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

type options struct {
	python    string
	device    string
	devices   []string // several: one rank per device (WithDevices)
	placement string   // "" (the worker decides), "replicate" or "shard"
	precision string
	compile   bool
	memory    int64 // WithMemory's bound (0: none)
	log       *slog.Logger
	kernels   kernels.Backend
}

// Option configures the engine.
type Option func(*options) error

// WithPython sets the interpreter (default: $PSYCHE_PYTHON, else
// SetupPython's, else python3 on PATH, then /usr/bin/python3: the first with
// torch 2.6+ and numpy).
func WithPython(path string) Option { return func(o *options) error { o.python = path; return nil } }

var deviceRE = regexp.MustCompile(`^(cpu|mps|cuda(:[0-9]+)?)$`)

// WithDevice sets the torch device: cpu, cuda, cuda:N or mps (default cpu).
// A ROCm build of torch names its GPUs cuda too.
func WithDevice(d string) Option {
	return func(o *options) error {
		if !deviceRE.MatchString(d) {
			return fmt.Errorf("torch engine: device %q: want cpu, cuda, cuda:N or mps", d)
		}
		o.device = d
		return nil
	}
}

// WithDevices runs the worker over several devices, one process (rank)
// per device under torch.distributed: cuda:0,cuda:1,… (NCCL), all (every
// CUDA device torch sees), or cpu,cpu,… (gloo: tests and benchmarks). The
// trainer's batch is split across the ranks and their gradients summed;
// psyche still sees one engine, one frame a round. One device is
// WithDevice's.
func WithDevices(ds []string) Option {
	return func(o *options) error {
		if err := checkDevices(ds); err != nil {
			return err
		}
		if len(ds) == 1 && ds[0] != "all" {
			o.device, o.devices = ds[0], nil
			return nil
		}
		o.devices = slices.Clone(ds)
		return nil
	}
}

var cudaIndexRE = regexp.MustCompile(`^cuda:[0-9]+$`)

// checkDevices says what is wrong with a list of devices, in one line.
func checkDevices(ds []string) error {
	list := strings.Join(ds, ",")
	switch {
	case len(ds) == 0:
		return errors.New("torch engine: devices: none given; want cuda:0,cuda:1,…, all or cpu,cpu")
	case len(ds) == 1 && ds[0] == "all":
		return nil
	case len(ds) == 1:
		if !deviceRE.MatchString(ds[0]) {
			return fmt.Errorf("torch engine: devices %q: want cpu, cuda, cuda:N or mps, a list of them, or all", list)
		}
		return nil
	}
	seen := map[string]bool{}
	for _, d := range ds {
		switch {
		case d == "all":
			return fmt.Errorf("torch engine: devices %q: all stands alone (every CUDA device)", list)
		case d != "cpu" && !cudaIndexRE.MatchString(d):
			return fmt.Errorf("torch engine: devices %q: %q cannot be one of several; want cuda:N for each GPU (or cpu,cpu)", list, d)
		case (d == "cpu") != (ds[0] == "cpu"):
			return fmt.Errorf("torch engine: devices %q: all cpu or all cuda:N, not both", list)
		case d != "cpu" && seen[d]:
			return fmt.Errorf("torch engine: devices %q: %s is named twice", list, d)
		}
		seen[d] = true
	}
	return nil
}

// WithPlacement overrides how a multi-device worker holds the model, which
// the worker otherwise decides from the model's size and the devices'
// memory ("" or "auto"): "replicate" (data parallel: every device holds the
// model, its gradient and DisTrO state) or "shard" (FSDP2: each device holds
// its shard of the parameters and the gradient, fully_shard per transformer
// block, and its share of DisTrO's state). Tests use it to run the sharded
// mode on small models.
func WithPlacement(p string) Option {
	return func(o *options) error {
		if p == "auto" {
			p = ""
		}
		if p != "" && p != "replicate" && p != "shard" {
			return fmt.Errorf("torch engine: placement %q: want auto, replicate or shard", p)
		}
		o.placement = p
		return nil
	}
}

// WithPrecision sets the arithmetic: "fp32" (default) or "bf16" (autocast
// over float32 master weights: the matrix products and attention in
// bfloat16, norms, losses, gradients and DisTrO in float32).
func WithPrecision(p kernels.Precision) Option {
	return func(o *options) error {
		switch p {
		case "", kernels.FP32:
			o.precision = "fp32"
		case kernels.BF16:
			o.precision = "bf16"
		default:
			return fmt.Errorf("torch engine: precision %q: want fp32 or bf16", p)
		}
		return nil
	}
}

// WithCompile compiles the model's forward and backward with torch.compile.
// Each batch shape compiles at its first use (a minute or more on a CPU);
// the kernels persist in psyche's cache directory (inductorCacheEnv), so a
// later worker on the same shapes starts in seconds.
func WithCompile(on bool) Option { return func(o *options) error { o.compile = on; return nil } }

// WithMemory bounds the memory, in bytes, that a model's training may take
// on the device: the check before joining (CheckModel) refuses a model
// whose training state needs more than the smaller of this and what the
// device has (on the CPU, which reports none, the machine's RAM). 0: no
// bound but the device's.
func WithMemory(bytes int64) Option {
	return func(o *options) error {
		if bytes < 0 {
			return fmt.Errorf("torch engine: memory bound %d: want 0 (none) or more", bytes)
		}
		o.memory = bytes
		return nil
	}
}

// WithLogger sets the logger (default: discard); the worker's start line is
// logged at info level, the rest of its output at debug.
func WithLogger(l *slog.Logger) Option { return func(o *options) error { o.log = l; return nil } }

// WithKernels sets the kernels of the host models Model returns (default:
// kernels.Default()).
func WithKernels(k kernels.Backend) Option {
	return func(o *options) error { o.kernels = k; return nil }
}

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
	what := fmt.Sprintf("the %s of %d parameters", archName(e.cfg.Arch), e.params)
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

func archName(a coordinator.Architecture) string {
	switch a {
	case coordinator.ArchLlama:
		return "Llama"
	case coordinator.ArchTransformers:
		return "transformers model"
	}
	return "GPT"
}

// ModelConfig is one of psyche's own models (GPT or Llama) as the worker's
// models.build reads it: its architecture's name and its shape, every value
// given (the norms' ε too: the worker fills in no default of its own).
// Tests and benchmarks that drive the worker's models directly use it.
func ModelConfig(c modelspec.Config) (arch string, config map[string]any) {
	if c.Arch == coordinator.ArchLlama {
		l := c.Llama
		return "llama", map[string]any{"vocab": l.Vocab, "context": l.Context, "width": l.Width, "layers": l.Layers,
			"heads": l.Heads, "kv_heads": l.KVHeads, "intermediate": l.Intermediate, "rope_theta": l.RopeTheta,
			"tied_head": l.TiedHead, "norm_eps": l.Eps()}
	}
	g := c.GPT
	return "gpt", map[string]any{"vocab": g.Vocab, "context": g.Context, "width": g.Width, "layers": g.Layers, "heads": g.Heads,
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
		arch, mc = "transformers", transformersConfig(e.cfg.Transformers, e.json)
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

// alive reports whether the worker process has not exited.
func (w *worker) alive() bool {
	select {
	case <-w.exited:
		return false
	default:
		return true
	}
}
