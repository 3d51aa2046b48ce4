// Command benchengine times a trainer's round through an engine
// (trainer/engine): the gradient of a batch, the DisTrO step that
// compresses it into the trainer's frame, and the apply of the round's
// frames (the trainer's own and -peers−1 more), as a node drives them, and
// prints one JSON line per engine run. scripts/bench-engine puts the torch
// engine beside a plain PyTorch loop (scripts/bench_engine_ref.py, the
// same worker modules in one process) and the Go engine; scripts/gpu-check
// runs the torch engine at the Llama-3.2-1B shape on a GPU.
//
//	go run ./scripts/benchengine -shape 10M -batch 8 -seq 128 -engines torch,plain-torch,go -interleave \
//	    -threads 1 -python /usr/bin/python3
//	benchengine -shape 1B -seq 2048 -batches 16,8,4,2,1 -engines torch,plain-torch -modes eager,compile \
//	    -ref-modes eager -device cuda -precision bf16
//
// plain-torch is scripts/bench_engine_ref.py run in lockstep (-ref, its
// --lockstep mode): it takes each round from benchengine and times it
// itself, so with -interleave the engines take rounds in turn and a shared
// machine's load falls on them alike. Each figure is the median over the
// timed rounds. With -batches, the first batch that does not run out of
// device memory is used, and the engines after start from it.
//
// Every engine starts from the same seeded weights and trains on the same
// batches (tokens from a hash of the round and position, which
// bench_engine_ref.py computes the same way), and the frames of the other
// peers are synthetic (k distinct indices per tile, ±1 values, from a hash
// of peer, tensor and tile: the same in bench_engine_ref.py), made before
// the timed rounds as a trainer receives them over the network. So the
// engines' per-round losses say whether they did the same arithmetic: the
// torch engine's and the plain loop's should be equal.
//
// -spec-out writes what bench_engine_ref.py needs to do the same work (the
// model's shape, the DisTrO plan's tile layouts, the options, the peers),
// -weights-out the initial weights (float32, tensor after tensor).
//
// On a CUDA device the torch worker's device memory is read from
// nvidia-smi (the engine does not report torch's own counters): the memory
// its process holds after the timed rounds, which with torch's caching
// allocator is its peak reservation plus the CUDA context.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// shapes are the benchmark's models: the Llamas of stepbench
// (trainer/llama/internal/stepbench) and scripts/gpu_torch_ref.py, a tiny
// one for quick runs, and bench-train's GPTs.
var shapes = map[string]runmodel.Config{
	"tiny": {Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4, KVHeads: 2,
		Intermediate: 176, RopeTheta: 10000, TiedHead: true}},
	"10M": {Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 256, Context: 128, Width: 384, Layers: 6, Heads: 6, KVHeads: 2,
		Intermediate: 1024, RopeTheta: 10000, TiedHead: true}},
	"50M": {Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 256, Context: 128, Width: 640, Layers: 11, Heads: 10, KVHeads: 5,
		Intermediate: 1728, RopeTheta: 10000, TiedHead: true}},
	"125M": {Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 32000, Context: 1024, Width: 768, Layers: 12, Heads: 12, KVHeads: 4,
		Intermediate: 2048, RopeTheta: 10000, TiedHead: true}},
	// examples/llama-1b-run.toml's [model]
	"1B": {Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 128256, Context: 2048, Width: 2048, Layers: 16, Heads: 32, KVHeads: 8,
		Intermediate: 8192, RopeTheta: 500000, TiedHead: true}},
	// Larger Llama 3 shapes, for the search of the largest that trains on
	// a machine's GPUs (scripts/gpu-check torch-engine, part multi): about
	// 3.2, 8.0 and 14 billion parameters (the last Llama 3's vocabulary on
	// a Llama 2 13B body, with grouped-query attention).
	"3B": {Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 128256, Context: 2048, Width: 3072, Layers: 28, Heads: 24, KVHeads: 8,
		Intermediate: 8192, RopeTheta: 500000, TiedHead: true}},
	"8B": {Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 128256, Context: 2048, Width: 4096, Layers: 32, Heads: 32, KVHeads: 8,
		Intermediate: 14336, RopeTheta: 500000}},
	"14B": {Arch: coordinator.ArchLlama, Llama: llama.Config{Vocab: 128256, Context: 2048, Width: 5120, Layers: 40, Heads: 40, KVHeads: 8,
		Intermediate: 13824, RopeTheta: 500000}},
	"gpt-tiny": {Arch: coordinator.ArchGPT, GPT: gpt.Config{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4}},
	"gpt-10M":  {Arch: coordinator.ArchGPT, GPT: gpt.Config{Vocab: 256, Context: 128, Width: 384, Layers: 6, Heads: 6}},
}

// result is one engine run: what scripts/bench-engine and gpu-check read.
// The per-phase figures are medians over the timed rounds (a shared machine's
// load comes and goes); the rounds' own figures are listed too.
type result struct {
	Engine        string    `json:"engine"`              // torch, torch-ranks, plain-torch or go
	Ranks         int       `json:"ranks,omitempty"`     // torch-ranks: devices, a process each
	Placement     string    `json:"placement,omitempty"` // torch-ranks: how the ranks hold the model (the engine's name says)
	Mode          string    `json:"mode"`                // eager or compile (torch, plain-torch); "" for go
	Name          string    `json:"name,omitempty"`
	Shape         string    `json:"shape"`
	Arch          string    `json:"arch"`
	Params        int       `json:"params"`
	Batch         int       `json:"batch"`
	Seq           int       `json:"seq"`
	Rounds        int       `json:"rounds"`
	Peers         int       `json:"peers"`
	Precision     string    `json:"precision"`
	Device        string    `json:"device"`
	Threads       int       `json:"threads"`
	Interleaved   bool      `json:"interleaved,omitempty"`
	TokensPerS    float64   `json:"tokens_per_s,omitempty"` // batch×seq over the median round
	RoundMS       float64   `json:"round_ms,omitempty"`
	GradientMS    float64   `json:"gradient_ms,omitempty"`
	StepMS        float64   `json:"step_ms,omitempty"`
	ApplyMS       float64   `json:"apply_ms,omitempty"`
	MeanRoundMS   float64   `json:"mean_round_ms,omitempty"`
	DistroShare   float64   `json:"distro_share,omitempty"` // median (step + apply) / round
	Times         []phases  `json:"round_times,omitempty"`
	OpenS         float64   `json:"open_s,omitempty"`
	WarmupS       float64   `json:"warmup_s,omitempty"`
	FLOPsPerToken float64   `json:"flops_per_token"`
	Losses        []float32 `json:"losses,omitempty"` // every round's mean loss, warm-up rounds first
	SameWeights   bool      `json:"same_weights"`     // started from the seeded weights every engine here starts from
	DeviceMem     int64     `json:"device_mem_bytes,omitempty"`
	DeviceMemHow  string    `json:"device_mem_source,omitempty"`
	PeakMem       int64     `json:"peak_mem_bytes,omitempty"` // torch.cuda.max_memory_allocated (the engine's worker or plain torch)
	HostPeakRSS   int64     `json:"host_peak_rss_bytes,omitempty"`
	HostRSSOf     string    `json:"host_peak_rss_of,omitempty"`
	Torch         string    `json:"torch,omitempty"`
	Tried         []string  `json:"tried,omitempty"` // batches refused (out of memory) before Batch
	Error         string    `json:"error,omitempty"`
}

// phases is one timed round, in milliseconds.
type phases struct {
	Round    float64 `json:"round"`
	Gradient float64 `json:"gradient"`
	Step     float64 `json:"step"`
	Apply    float64 `json:"apply"`
}

type settings struct {
	shape, device, prec, python, ref string
	devices                          []string // torch-ranks
	cfg                              runmodel.Config
	seq, rounds, warmup, peers       int
	batches                          []int
	threads                          int
	seed                             uint64
	lr                               float32
	opts                             distro.Options
	nvsmi                            bool
	specPath, weightsPath            string         // what the plain-torch runner reads
	host                             runmodel.Model // the seeded model the torch engines open on (they copy it)
}

func main() {
	shape := flag.String("shape", "10M", "model shape: tiny, 10M, 50M, 125M, 1B (examples/llama-1b-run.toml), gpt-tiny or gpt-10M")
	batch := flag.Int("batch", 4, "sequences per round")
	batchesF := flag.String("batches", "", "batches to try in order, the first that fits the device is timed (e.g. 16,8,4,2,1); overrides -batch")
	seq := flag.Int("seq", 128, "tokens per sequence (at most the shape's context)")
	rounds := flag.Int("rounds", 5, "timed rounds")
	warmup := flag.Int("warmup", 1, "untimed rounds first (torch.compile compiles in them)")
	engines := flag.String("engines", "torch,go", "what to run, in order: torch (the engine), torch-ranks (the engine over -devices), plain-torch (scripts/bench_engine_ref.py in lockstep), go (the engine)")
	devices := flag.String("devices", "cpu,cpu", "torch-ranks: the devices, a rank each (cuda:0,cuda:1,…, all, or cpu,cpu)")
	modes := flag.String("modes", "eager", "the torch engine's modes: eager, compile or both (eager,compile)")
	refModes := flag.String("ref-modes", "", "plain-torch's modes (default: -modes)")
	interleave := flag.Bool("interleave", false, "open every engine first, then run each round on each in turn (a shared machine's load then falls on all alike)")
	device := flag.String("device", "cpu", "the torch device: cpu, cuda, cuda:N or mps")
	prec := flag.String("precision", "fp32", "fp32 or bf16 (the Go engine on a CPU computes fp32 and says so)")
	python := flag.String("python", "", "the python of the torch worker and of plain-torch (default: the engine's own choice; python3 for plain-torch)")
	ref := flag.String("ref", "scripts/bench_engine_ref.py", "the plain-torch reference script")
	threads := flag.Int("threads", 0, "threads for every engine: GOMAXPROCS, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS (0: leave them)")
	topk := flag.Int("topk", 12, "DisTrO coefficients per tile (clamped to the tile's size)")
	chunk := flag.Int("chunk", 64, "DisTrO tiles are at most chunk×chunk")
	decay := flag.Float64("decay", 0.97, "DisTrO momentum decay")
	clip := flag.Float64("clip", 1, "gradient norm clip (0: off)")
	wd := flag.Float64("weight-decay", 0, "decoupled weight decay")
	quant := flag.Bool("quantize", true, "1-bit values")
	agg := flag.String("aggregation", "robust", "robust, mean or clipped-mean")
	norm := flag.String("normalize", "rms", "rms or none")
	peers := flag.Int("peers", 3, "frames applied each round: the trainer's own and peers-1 synthetic ones")
	lr := flag.Float64("lr", 1e-4, "learning rate of every round")
	seed := flag.Uint64("seed", 1, "seed of the initial weights")
	specOut := flag.String("spec-out", "", "write the model, plan and options here (JSON) for scripts/bench_engine_ref.py")
	weightsOut := flag.String("weights-out", "", "write the initial weights here (float32 little-endian, tensor after tensor)")
	nvsmi := flag.Bool("nvidia-smi", true, "on a CUDA device, read the torch worker's device memory from nvidia-smi")
	flag.Parse()

	cfg, ok := shapes[*shape]
	tmpDir := ""
	exit := func(code int) {
		if tmpDir != "" {
			_ = os.RemoveAll(tmpDir)
		}
		os.Exit(code)
	}
	fail := func(err error) {
		out, _ := json.Marshal(result{Shape: *shape, Error: err.Error()})
		fmt.Println(string(out))
		exit(1)
	}
	if !ok {
		fail(fmt.Errorf("unknown shape %q", *shape))
	}
	if *seq < 1 || *seq > cfg.Context() {
		fail(fmt.Errorf("seq %d does not fit shape %s (context %d)", *seq, *shape, cfg.Context()))
	}
	p, err := kernels.ParsePrecision(*prec)
	if err != nil {
		fail(err)
	}
	a, ok := distro.ParseAggregation(*agg)
	if !ok {
		fail(fmt.Errorf("aggregation %q: want one of %v", *agg, distro.AggregationNames()))
	}
	if *norm != "rms" && *norm != "none" {
		fail(fmt.Errorf("normalize %q: want rms or none", *norm))
	}
	if *peers < 1 || *rounds < 1 || *warmup < 0 {
		fail(errors.New("peers and rounds must be at least 1, warmup at least 0"))
	}
	bs := []int{*batch}
	if *batchesF != "" {
		bs = nil
		for _, f := range strings.Split(*batchesF, ",") {
			b, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || b < 1 {
				fail(fmt.Errorf("-batches %q: want positive integers", *batchesF))
			}
			bs = append(bs, b)
		}
	}
	if *threads > 0 {
		runtime.GOMAXPROCS(*threads)
		// The torch worker and plain-torch inherit the environment: torch
		// and OpenMP read OMP_NUM_THREADS when they start.
		_ = os.Setenv("OMP_NUM_THREADS", strconv.Itoa(*threads))
		_ = os.Setenv("OPENBLAS_NUM_THREADS", strconv.Itoa(*threads))
	}
	s := &settings{shape: *shape, device: *device, devices: strings.Split(*devices, ","), prec: string(p), python: *python, ref: *ref,
		cfg: cfg, seq: *seq, rounds: *rounds,
		warmup: *warmup, peers: *peers, batches: bs, threads: runtime.GOMAXPROCS(0), seed: *seed, lr: float32(*lr),
		nvsmi: *nvsmi && strings.HasPrefix(*device, "cuda"),
		opts: distro.Options{Chunk: *chunk, TopK: *topk, Quantize1Bit: *quant, RiceIndices: true, Decay: float32(*decay),
			WeightDecay: float32(*wd), ClipGradNorm: float32(*clip), Aggregation: a, NormalizeRMS: *norm == "rms",
			Workers: runtime.GOMAXPROCS(0)}}

	var runners []runner
	for _, e := range strings.Split(*engines, ",") {
		e = strings.TrimSpace(e)
		switch e {
		case "torch", "plain-torch":
			ms := *modes
			if e == "plain-torch" && *refModes != "" {
				ms = *refModes
			}
			for _, m := range strings.Split(ms, ",") {
				m = strings.TrimSpace(m)
				if m != "eager" && m != "compile" {
					fail(fmt.Errorf("modes %q: want eager, compile or both", ms))
				}
				if e == "torch" {
					runners = append(runners, &torchRunner{engineRunner: engineRunner{s: s}, compile: m == "compile"})
				} else {
					runners = append(runners, &refRunner{s: s, compile: m == "compile"})
				}
			}
		case "torch-ranks":
			runners = append(runners, &torchRunner{engineRunner: engineRunner{s: s}, ranks: true})
		case "go":
			runners = append(runners, &goRunner{engineRunner{s: s}})
		default:
			fail(fmt.Errorf("-engines %q: want torch, torch-ranks, plain-torch and/or go", *engines))
		}
	}

	specPath, weightsPath := *specOut, *weightsOut
	needRef := strings.Contains(*engines, "plain-torch")
	if needRef && (specPath == "" || weightsPath == "") {
		dir, err := os.MkdirTemp("", "benchengine-")
		if err != nil {
			fail(err)
		}
		tmpDir = dir
		if specPath == "" {
			specPath = filepath.Join(dir, "spec.json")
		}
		// Weights for plain-torch up to 200M parameters (a file of 800 MB);
		// above, it draws its own (and its losses are not comparable).
		if weightsPath == "" && cfg.NumParams() <= 200_000_000 {
			weightsPath = filepath.Join(dir, "weights.bin")
		}
	}
	if specPath != "" || weightsPath != "" {
		if err := writeSpec(s, specPath, weightsPath); err != nil {
			fail(err)
		}
	}
	s.specPath, s.weightsPath = specPath, weightsPath

	ctx := context.Background()
	failed := false
	if *interleave {
		for _, r := range runners {
			r.open(ctx)
		}
		for round := 0; round < s.warmup+s.rounds; round++ {
			for _, r := range runners {
				r.step(ctx, round)
			}
		}
		for _, r := range runners {
			r.res().Interleaved = true
			failed = emit(finish(r)) || failed
		}
	} else {
		for _, r := range runners {
			r.open(ctx)
			for round := 0; round < s.warmup+s.rounds; round++ {
				r.step(ctx, round)
			}
			failed = emit(finish(r)) || failed
		}
	}
	if failed {
		exit(1)
	}
	exit(0)
}

// emit prints r as a JSON line and says whether it failed.
func emit(r *result) bool {
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	return r.Error != ""
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchengine: "+format+"\n", args...)
}

func archName(c runmodel.Config) string {
	if c.Arch == coordinator.ArchLlama {
		return "llama"
	}
	return "gpt"
}

func vocab(c runmodel.Config) int {
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.Vocab
	}
	return c.GPT.Vocab
}

func flopsPerToken(c runmodel.Config, t int) float64 {
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.FLOPsPerToken(t)
	}
	return c.GPT.FLOPsPerToken(t)
}

func newResult(s *settings, eng, mode string) result {
	return result{Engine: eng, Mode: mode, Shape: s.shape, Arch: archName(s.cfg), Params: s.cfg.NumParams(), Seq: s.seq,
		Rounds: s.rounds, Peers: s.peers, Precision: s.prec, Device: s.device, Threads: s.threads,
		FLOPsPerToken: flopsPerToken(s.cfg, s.seq), SameWeights: true}
}

// newModel is the seeded model every engine starts from: with be nil, one
// kept for every engine that copies it (the torch engines, the spec's
// weights), else a new one on be (the Go engine trains it in place).
func newModel(s *settings, be kernels.Backend) (runmodel.Model, error) {
	if be == nil && s.host != nil {
		return s.host, nil
	}
	t0 := time.Now()
	m, err := runmodel.New(s.cfg, s.seed, be)
	if err == nil && time.Since(t0) > 5*time.Second {
		logf("seeded the %s model (%d parameters) in %.1f s", s.shape, m.NumParams(), time.Since(t0).Seconds())
	}
	if err == nil && be == nil {
		s.host = m
	}
	return m, err
}

// runner is one engine under test: open, then one call of step per round
// (warm-up rounds first), then close.
type runner interface {
	res() *result
	open(ctx context.Context)
	// step runs the next round (nothing once the runner has failed).
	step(ctx context.Context, round int)
	// round runs one round at batch b: the gradient's, the step's and the
	// apply's durations, and the batch's loss.
	round(ctx context.Context, round, b int) (l float32, grad, step, apply time.Duration, err error)
	close()
}

// base holds what every runner shares: its result and its batch (0 until
// the first round found one that fits).
type base struct {
	r     result
	batch int
	warm  time.Time
}

func (b *base) res() *result { return &b.r }

// stepWith runs round on r (nothing once r has failed), finding the batch in
// the first round: each of the settings' batches in turn until one does not
// run out of device memory.
func (b *base) stepWith(ctx context.Context, r runner, s *settings, round int) {
	res := r.res()
	if res.Error != "" {
		return
	}
	if round == 0 {
		b.warm = time.Now()
	}
	var (
		l                 float32
		grad, step, apply time.Duration
		err               error
	)
	if b.batch == 0 {
		for _, bs := range s.batches {
			l, grad, step, apply, err = r.round(ctx, round, bs)
			if err != nil && strings.Contains(err.Error(), "out of memory") {
				logf("%s %s: batch %d×%d does not fit: %s", res.Engine, res.Mode, bs, s.seq, firstLine(err.Error()))
				res.Tried = append(res.Tried, strconv.Itoa(bs))
				continue
			}
			b.batch = bs
			// Later runners start from this batch: a smaller one is
			// what they are compared at, and a larger one did not fit.
			for i, c := range s.batches {
				if c == bs {
					s.batches = s.batches[i:]
					break
				}
			}
			break
		}
		if b.batch == 0 && err == nil {
			err = fmt.Errorf("no batch of %v fits", s.batches)
		}
		res.Batch = b.batch
	} else {
		l, grad, step, apply, err = r.round(ctx, round, b.batch)
	}
	if err != nil {
		res.Error = fmt.Sprintf("round %d: %v", round, err)
		logf("%s %s: %s", res.Engine, res.Mode, res.Error)
		return
	}
	res.Losses = append(res.Losses, l)
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 }
	warm := round < s.warmup
	if !warm {
		res.Times = append(res.Times, phases{Round: ms(grad + step + apply), Gradient: ms(grad), Step: ms(step), Apply: ms(apply)})
	}
	if round == s.warmup-1 {
		res.WarmupS = time.Since(b.warm).Seconds()
	}
	logf("%s %s round %d: loss %.4f, gradient %.0f ms, step %.0f ms, apply %.0f ms%s", res.Engine, res.Mode, round, l,
		ms(grad), ms(step), ms(apply), map[bool]string{true: " (warm-up)"}[warm])
}

// finish closes r and fills its summary.
func finish(r runner) *result {
	r.close()
	res := r.res()
	n := len(res.Times)
	if n == 0 {
		if res.Error == "" {
			res.Error = "no timed round"
		}
		return res
	}
	med := func(f func(phases) float64) float64 {
		v := make([]float64, n)
		for i, p := range res.Times {
			v[i] = f(p)
		}
		sort.Float64s(v)
		if n%2 == 1 {
			return v[n/2]
		}
		return (v[n/2-1] + v[n/2]) / 2
	}
	res.RoundMS = med(func(p phases) float64 { return p.Round })
	res.GradientMS = med(func(p phases) float64 { return p.Gradient })
	res.StepMS = med(func(p phases) float64 { return p.Step })
	res.ApplyMS = med(func(p phases) float64 { return p.Apply })
	res.DistroShare = med(func(p phases) float64 { return (p.Step + p.Apply) / p.Round })
	var sum float64
	for _, p := range res.Times {
		sum += p.Round
	}
	res.MeanRoundMS = sum / float64(n)
	res.TokensPerS = float64(res.Batch*res.Seq) / (res.RoundMS / 1e3)
	return res
}

// engineRunner drives an engine.Engine as a node does.
type engineRunner struct {
	base
	s      *settings
	e      engine.Engine
	others []*distro.Frame
}

func (er *engineRunner) openEngine(ctx context.Context, op engine.Opener, m runmodel.Model) {
	t0 := time.Now()
	e, err := op.Open(ctx, engine.Spec{Model: m, Optimizer: er.s.opts, Timeout: 30 * time.Minute})
	if err != nil {
		er.r.Error = "open: " + err.Error()
		return
	}
	er.r.OpenS = time.Since(t0).Seconds()
	er.r.Name = e.Name()
	er.e = e
	if er.others, err = peerFrames(e.Plan(), er.s.peers-1); err != nil {
		er.r.Error = err.Error()
	}
}

func (er *engineRunner) round(ctx context.Context, round, b int) (float32, time.Duration, time.Duration, time.Duration, error) {
	batch := makeBatch(round, b, er.s.seq, vocab(er.s.cfg)) // before the clock: a node has its batch in hand
	t0 := time.Now()
	l, err := er.e.Gradient(ctx, batch)
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("gradient: %w", err)
	}
	t1 := time.Now()
	f, err := er.e.Step(ctx, er.s.lr)
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("step: %w", err)
	}
	t2 := time.Now()
	if err := er.e.Apply(ctx, append([]*distro.Frame{f}, er.others...), er.s.lr); err != nil {
		return 0, 0, 0, 0, fmt.Errorf("apply: %w", err)
	}
	t3 := time.Now()
	return l.Mean, t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), nil
}

type torchRunner struct {
	engineRunner
	compile bool
	ranks   bool // over the settings' devices
	pid     int
}

func (tr *torchRunner) open(ctx context.Context) {
	s := tr.s
	mode := map[bool]string{false: "eager", true: "compile"}[tr.compile]
	tr.r = newResult(s, "torch", mode)
	dev := torch.WithDevice(s.device)
	if tr.ranks {
		tr.r.Engine, tr.r.Device, tr.r.Ranks = "torch-ranks", strings.Join(s.devices, ","), len(s.devices)
		dev = torch.WithDevices(s.devices)
	}
	opts := []torch.Option{dev, torch.WithPrecision(kernels.Precision(s.prec)), torch.WithCompile(tr.compile)}
	if s.python != "" {
		opts = append(opts, torch.WithPython(s.python))
	}
	op, err := torch.New(opts...)
	if err != nil {
		tr.r.Error = err.Error()
		return
	}
	m, err := newModel(s, nil)
	if err != nil {
		tr.r.Error = err.Error()
		return
	}
	tr.openEngine(ctx, op, m)
	if tr.e != nil {
		if p, ok := tr.e.(interface{ Pid() int }); ok {
			tr.pid = p.Pid()
		}
		if tr.ranks {
			tr.r.Name = tr.e.Name()
			if i := strings.LastIndex(tr.r.Name, " ranks, "); i >= 0 {
				tr.r.Placement = strings.TrimSuffix(tr.r.Name[i+len(" ranks, "):], ")")
			}
		}
	}
}

func (tr *torchRunner) step(ctx context.Context, round int) { tr.stepWith(ctx, tr, tr.s, round) }

func (tr *torchRunner) close() {
	if tr.e == nil {
		return
	}
	if m, ok := tr.e.(interface {
		Memory(context.Context, bool) (torch.Memory, error)
	}); ok {
		if mem, err := m.Memory(context.Background(), false); err == nil && mem.Peak > 0 {
			tr.r.PeakMem = mem.Peak // torch.cuda.max_memory_allocated in the worker
		}
	}
	if tr.pid != 0 {
		if tr.s.nvsmi {
			if mem, err := nvidiaSMIMemory(tr.pid); err == nil {
				tr.r.DeviceMem, tr.r.DeviceMemHow = mem, "nvidia-smi: the worker process's device memory after the timed rounds (torch's caching allocator keeps its peak reserved; CUDA context included)"
			} else {
				tr.r.DeviceMemHow = "nvidia-smi: " + err.Error()
			}
		}
		if rss, err := peakRSS(strconv.Itoa(tr.pid)); err == nil {
			tr.r.HostPeakRSS, tr.r.HostRSSOf = rss, "the torch worker"
		}
	}
	_ = tr.e.Close()
}

type goRunner struct{ engineRunner }

func (gr *goRunner) open(ctx context.Context) {
	s := gr.s
	be, got := kernels.WithPrecision(kernels.Default(), kernels.Precision(s.prec))
	gr.r = newResult(s, "go", "")
	gr.r.Device, gr.r.Precision = be.Name(), string(got)
	m, err := newModel(s, be)
	if err != nil {
		gr.r.Error = err.Error()
		return
	}
	gr.openEngine(ctx, engine.Go(be), m)
}

func (gr *goRunner) step(ctx context.Context, round int) { gr.stepWith(ctx, gr, gr.s, round) }

func (gr *goRunner) close() {
	if gr.e == nil {
		return
	}
	if rss, err := peakRSS("self"); err == nil {
		gr.r.HostPeakRSS, gr.r.HostRSSOf = rss, "this process (every engine it ran)"
	}
	_ = gr.e.Close()
}

// refRunner drives scripts/bench_engine_ref.py --lockstep: one request line
// per round on its stdin, one JSON line per answer on its stdout.
type refRunner struct {
	base
	s       *settings
	compile bool
	cmd     *exec.Cmd
	in      io.WriteCloser
	out     *bufio.Scanner
}

func (rr *refRunner) open(ctx context.Context) {
	s := rr.s
	mode := map[bool]string{false: "eager", true: "compile"}[rr.compile]
	rr.r = newResult(s, "plain-torch", mode)
	rr.r.SameWeights = s.weightsPath != ""
	py := s.python
	if py == "" {
		py = "python3"
	}
	args := []string{"-u", s.ref, "--lockstep", "--spec", s.specPath, "--seq", strconv.Itoa(s.seq), "--device", s.device,
		"--precision", s.prec, "--threads", strconv.Itoa(s.threads)}
	if s.weightsPath != "" {
		args = append(args, "--weights", s.weightsPath)
	}
	if rr.compile {
		args = append(args, "--compile")
	}
	t0 := time.Now()
	rr.cmd = exec.CommandContext(ctx, py, args...)
	rr.cmd.Stderr = os.Stderr
	dieWithUs(rr.cmd)
	var err error
	if rr.in, err = rr.cmd.StdinPipe(); err != nil {
		rr.r.Error = err.Error()
		return
	}
	stdout, err := rr.cmd.StdoutPipe()
	if err != nil {
		rr.r.Error = err.Error()
		return
	}
	rr.out = bufio.NewScanner(stdout)
	rr.out.Buffer(make([]byte, 1<<20), 1<<24)
	if err := rr.cmd.Start(); err != nil {
		rr.r.Error = fmt.Sprintf("%s %s: %v", py, s.ref, err)
		rr.cmd = nil
		return
	}
	var ready struct {
		Name  string `json:"name"`
		Torch string `json:"torch"`
		Error string `json:"error"`
	}
	if err := rr.answer(&ready); err != nil {
		rr.r.Error = err.Error()
		return
	}
	rr.r.OpenS = time.Since(t0).Seconds()
	rr.r.Name, rr.r.Torch = ready.Name, ready.Torch
}

// answer reads the next JSON line of the reference into v (lines that are
// not JSON objects are passed to stderr).
func (rr *refRunner) answer(v any) error {
	for rr.out.Scan() {
		line := strings.TrimSpace(rr.out.Text())
		if !strings.HasPrefix(line, "{") {
			fmt.Fprintln(os.Stderr, line)
			continue
		}
		var e struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return fmt.Errorf("plain-torch answered %q: %v", line, err)
		}
		if e.Error != "" {
			return errors.New(e.Error)
		}
		return json.Unmarshal([]byte(line), v)
	}
	if err := rr.out.Err(); err != nil {
		return err
	}
	return errors.New("plain-torch exited")
}

func (rr *refRunner) step(ctx context.Context, round int) { rr.stepWith(ctx, rr, rr.s, round) }

func (rr *refRunner) round(_ context.Context, round, b int) (float32, time.Duration, time.Duration, time.Duration, error) {
	if rr.cmd == nil {
		return 0, 0, 0, 0, errors.New("not started")
	}
	if _, err := fmt.Fprintf(rr.in, "round %d %d\n", round, b); err != nil {
		return 0, 0, 0, 0, err
	}
	var a struct {
		Loss       float32 `json:"loss"`
		GradientMS float64 `json:"gradient_ms"`
		StepMS     float64 `json:"step_ms"`
		ApplyMS    float64 `json:"apply_ms"`
	}
	if err := rr.answer(&a); err != nil {
		return 0, 0, 0, 0, err
	}
	d := func(ms float64) time.Duration { return time.Duration(ms * 1e6) }
	return a.Loss, d(a.GradientMS), d(a.StepMS), d(a.ApplyMS), nil
}

func (rr *refRunner) close() {
	if rr.cmd == nil {
		return
	}
	defer func() { _ = rr.cmd.Wait() }()
	if rr.cmd.ProcessState != nil {
		return
	}
	fmt.Fprintln(rr.in, "end")
	_ = rr.in.Close()
	var end struct {
		Threads     int    `json:"threads"`
		Device      string `json:"device"`
		PeakMem     int64  `json:"peak_mem_bytes"`
		HostPeakRSS int64  `json:"host_peak_rss_bytes"`
	}
	if err := rr.answer(&end); err == nil {
		rr.r.PeakMem, rr.r.HostPeakRSS, rr.r.HostRSSOf = end.PeakMem, end.HostPeakRSS, "plain-torch's process"
		if end.Threads != 0 {
			rr.r.Threads = end.Threads
		}
		if end.Device != "" {
			rr.r.Device = end.Device
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// mix is a 32-bit integer hash (lowbias32); bench_engine_ref.py has the
// same.
func mix(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x7feb352d
	x ^= x >> 15
	x *= 0x846ca68b
	x ^= x >> 16
	return x
}

// makeBatch is round's batch: b sequences of t tokens, the stream's token
// i being mix(i ^ mix(round + 0x9e3779b9)) % vocab, sequence j reading
// tokens j(t+1) .. j(t+1)+t (inputs the first t, targets the last t).
func makeBatch(round, b, t, vocab int) engine.Batch {
	key := mix(uint32(round) + 0x9e3779b9)
	in, tg := make([]uint32, b*t), make([]uint32, b*t)
	for j := range b {
		for p := range t {
			i := uint32(j*(t+1) + p)
			in[j*t+p] = mix(i^key) % uint32(vocab)
			tg[j*t+p] = mix((i+1)^key) % uint32(vocab)
		}
	}
	return engine.Batch{Inputs: in, Targets: tg, Seqs: b, SeqLen: t}
}

// peerFrames makes n frames of other peers: in tile t of tensor i of peer
// p (1..n), K distinct indices start + j·(ts/K) mod ts (start = h mod ts,
// h = mix(mix(mix(p) ^ i) ^ t)), value +1 where mix(h ^ (j+1)·0x9e3779b9)
// is odd, else −1 (1-bit or not).
func peerFrames(plan *distro.Plan, n int) ([]*distro.Frame, error) {
	var out []*distro.Frame
	layouts := plan.Layouts()
	for p := 1; p <= n; p++ {
		idx, vals := make([][]uint32, len(layouts)), make([][]float32, len(layouts))
		for i, l := range layouts {
			ts, k := l.TileH*l.TileW, l.K
			step := ts / k
			tiles := l.Tiles()
			idx[i], vals[i] = make([]uint32, 0, tiles*k), make([]float32, 0, tiles*k)
			for t := range tiles {
				h := mix(mix(mix(uint32(p))^uint32(i)) ^ uint32(t))
				start := int(h % uint32(ts))
				for j := range k {
					idx[i] = append(idx[i], uint32((start+j*step)%ts))
					v := float32(-1)
					if mix(h^(uint32(j+1)*0x9e3779b9))&1 == 1 {
						v = 1
					}
					vals[i] = append(vals[i], v)
				}
			}
		}
		f, err := plan.FrameOf(idx, vals)
		if err != nil {
			return nil, fmt.Errorf("peer frame %d: %w", p, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// modelConfig is the shape as the worker's models.build reads it (the
// torch engine sends the same).
func modelConfig(c runmodel.Config) map[string]any {
	if c.Arch == coordinator.ArchLlama {
		l := c.Llama
		eps := l.NormEps
		if eps == 0 {
			eps = llama.DefaultNormEps
		}
		return map[string]any{"vocab": l.Vocab, "context": l.Context, "width": l.Width, "layers": l.Layers,
			"heads": l.Heads, "kv_heads": l.KVHeads, "intermediate": l.Intermediate, "rope_theta": l.RopeTheta,
			"tied_head": l.TiedHead, "norm_eps": eps}
	}
	g := c.GPT
	return map[string]any{"vocab": g.Vocab, "context": g.Context, "width": g.Width, "layers": g.Layers, "heads": g.Heads}
}

// writeSpec writes what bench_engine_ref.py needs to repeat the work.
func writeSpec(s *settings, specPath, weightsPath string) error {
	m, err := newModel(s, nil)
	if err != nil {
		return err
	}
	plan, err := distro.NewPlan(m.Shapes(), s.opts)
	if err != nil {
		return err
	}
	if specPath != "" {
		var layouts []map[string]any
		for _, l := range plan.Layouts() {
			layouts = append(layouts, map[string]any{"shape": l.Shape, "outer": l.Outer, "rows": l.Rows, "cols": l.Cols,
				"th": l.TileH, "tw": l.TileW, "k": l.K})
		}
		o := s.opts
		spec := map[string]any{
			"shape": s.shape, "arch": archName(s.cfg), "config": modelConfig(s.cfg), "shapes": m.Shapes(), "layouts": layouts,
			"params": m.NumParams(), "flops_per_token": flopsPerToken(s.cfg, s.seq),
			"distro": map[string]any{"decay": o.Decay, "weight_decay": o.WeightDecay, "clip": o.ClipGradNorm,
				"quantize": o.Quantize1Bit, "normalize_rms": o.NormalizeRMS},
			"aggregation": o.Aggregation.String(), "peers": s.peers, "lr": s.lr, "seq": s.seq, "vocab": vocab(s.cfg),
		}
		b, err := json.MarshalIndent(spec, "", " ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(specPath, b, 0o644); err != nil {
			return err
		}
	}
	if weightsPath != "" {
		f, err := os.Create(weightsPath)
		if err != nil {
			return err
		}
		w := bufio.NewWriterSize(f, 1<<20)
		var buf [4]byte
		for _, t := range m.Tensors() {
			for _, v := range t {
				binary.LittleEndian.PutUint32(buf[:], math.Float32bits(v))
				_, _ = w.Write(buf[:]) // its error comes back from Flush
			}
		}
		if err := w.Flush(); err != nil {
			_ = f.Close()
			return err
		}
		return f.Close()
	}
	return nil
}

// nvidiaSMIMemory is the device memory nvidia-smi says process pid holds,
// in bytes.
func nvidiaSMIMemory(pid int) (int64, error) {
	out, err := exec.Command("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 2 {
			continue
		}
		if p, err := strconv.Atoi(strings.TrimSpace(f[0])); err != nil || p != pid {
			continue
		}
		mib, err := strconv.ParseInt(strings.TrimSpace(f[1]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("used_memory %q", f[1])
		}
		return mib << 20, nil
	}
	return 0, fmt.Errorf("process %d is not among its compute apps (a container may hide pids)", pid)
}

// peakRSS is a process's peak resident memory (VmHWM), in bytes, on Linux.
func peakRSS(pid string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmHWM")
}
