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
//	    -threads 1 -python "$(bash scripts/setup-torch --python)"
//	benchengine -shape 1B -seq 2048 -batches 16,8,4,2,1 -engines torch,plain-torch -modes eager,compile \
//	    -ref-modes eager -device cuda -precision bf16
//
// The shapes are psyche's Llamas and GPTs, and transformers Qwen3 models
// (qwen3-tiny, qwen3-50M, qwen3-1.7B: hf.go writes their config.json, the
// torch worker builds them with AutoModelForCausalLM.from_config and draws
// their weights from the seed, and plain-torch builds and draws them the
// same way and trains them in a plain transformers loop). The Go engine
// does not compute transformers models. torch-shard is the torch engine
// over -devices with placement shard (FSDP2); for a model the worker
// cannot shard it is reported as skipped.
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
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// shapes are the benchmark's models: the Llamas of stepbench
// (trainer/llama/internal/stepbench) and scripts/gpu_torch_ref.py, a tiny
// one for quick runs, and bench-train's GPTs.
var shapes = map[string]modelspec.Config{
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
	Engine        string    `json:"engine"`              // torch, torch-ranks, torch-shard, plain-torch or go
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
	Skipped       string    `json:"skipped,omitempty"` // why the engine did not run (not a failure)
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
	cfg                              modelspec.Config
	seq, rounds, warmup, peers       int
	batches                          []int
	threads                          int
	seed                             uint64
	lr                               float32
	opts                             distro.Options
	nvsmi                            bool
	specPath, weightsPath            string         // what the plain-torch runner reads
	host                             runmodel.Model // the seeded model the torch engines open on (they copy it)
	// A transformers shape (hfShapes): its model (drawn from the seed by
	// the torch worker and by bench_engine_ref.py alike), its tensors'
	// shapes as transformers builds them, and its count of FLOPs.
	tf     *runmodel.Transformers
	hf     qwen3
	shapes [][]int
}

func main() {
	shape := flag.String("shape", "10M", "model shape: tiny, 10M, 50M, 125M, 1B (examples/llama-1b-run.toml), 3B, 8B, 14B, gpt-tiny, gpt-10M, "+
		"or a transformers Qwen3 (config.json written here): qwen3-tiny, qwen3-50M, qwen3-1.7B")
	batch := flag.Int("batch", 4, "sequences per round")
	batchesF := flag.String("batches", "", "batches to try in order, the first that fits the device is timed (e.g. 16,8,4,2,1); overrides -batch")
	seq := flag.Int("seq", 128, "tokens per sequence (at most the shape's context)")
	rounds := flag.Int("rounds", 5, "timed rounds")
	warmup := flag.Int("warmup", 1, "untimed rounds first (torch.compile compiles in them)")
	engines := flag.String("engines", "torch,go", "what to run, in order: torch (the engine), torch-ranks (the engine over -devices, the worker's placement), "+
		"torch-shard (the same, FSDP2: placement shard), plain-torch (scripts/bench_engine_ref.py in lockstep), go (the engine)")
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
	tf, hfCfg, isHF, hfErr := hfModel(*shape, *seq, *seed)
	if isHF {
		cfg, ok = hfCfg, true
	}
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
	if hfErr != nil {
		fail(hfErr)
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
	ctx := context.Background()
	if isHF {
		s.tf, s.hf = tf, hfShapes[*shape]
		sh, err := describeHF(ctx, *python, tf)
		if err != nil {
			fail(err)
		}
		s.shapes = sh
	}

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
		case "torch-shard":
			runners = append(runners, &torchRunner{engineRunner: engineRunner{s: s}, ranks: true, shard: true})
		case "go":
			runners = append(runners, &goRunner{engineRunner{s: s}})
		default:
			fail(fmt.Errorf("-engines %q: want torch, torch-ranks, torch-shard, plain-torch and/or go", *engines))
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
		// above, it draws its own (and its losses are not comparable). A
		// transformers model's are drawn from the seed there as the
		// worker draws them.
		if weightsPath == "" && s.tf == nil && cfg.NumParams() <= 200_000_000 {
			weightsPath = filepath.Join(dir, "weights.bin")
		}
	}
	if specPath != "" || weightsPath != "" {
		if err := writeSpec(s, specPath, weightsPath); err != nil {
			fail(err)
		}
	}
	s.specPath, s.weightsPath = specPath, weightsPath

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

func vocab(c modelspec.Config) int {
	switch c.Arch {
	case coordinator.ArchLlama:
		return c.Llama.Vocab
	case coordinator.ArchTransformers:
		return c.Transformers.Vocab
	}
	return c.GPT.Vocab
}

func flopsPerToken(c modelspec.Config, t int) float64 {
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.FLOPsPerToken(t)
	}
	return c.GPT.FLOPsPerToken(t)
}

func newResult(s *settings, eng, mode string) result {
	params, flops := s.cfg.NumParams(), 0.0
	if s.tf != nil {
		params, flops = modelspec.NumParams(s.shapes), s.hf.flopsPerToken(s.seq)
	} else {
		flops = flopsPerToken(s.cfg, s.seq)
	}
	return result{Engine: eng, Mode: mode, Shape: s.shape, Arch: modelspec.ArchName(s.cfg.Arch), Params: params, Seq: s.seq,
		Rounds: s.rounds, Peers: s.peers, Precision: s.prec, Device: s.device, Threads: s.threads,
		FLOPsPerToken: flops, SameWeights: true}
}

// newModel is the seeded model every engine starts from: with be nil, one
// kept for every engine that copies it (the torch engines, the spec's
// weights), else a new one on be (the Go engine trains it in place).
func newModel(s *settings, be kernels.Backend) (runmodel.Model, error) {
	if s.tf != nil {
		if be != nil {
			return nil, errors.New("the Go engine does not compute transformers models (the torch engine does)")
		}
		return s.tf, nil
	}
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
