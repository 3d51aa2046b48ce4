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
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"

	"github.com/psyche-go/psyche/trainer/kernels"
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
