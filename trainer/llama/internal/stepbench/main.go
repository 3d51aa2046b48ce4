// Command stepbench times Llama training steps on the kernels this binary
// was built with (-tags cuda for the GPU), at shapes that a PyTorch
// reference (scripts/gpu_torch_ref.py) runs too, and prints one JSON line:
// what scripts/gpu-check puts beside PyTorch's figures. With -curve it
// instead trains the shape for that many steps at fp32 and at bf16 from the
// same start and compares the two loss curves.
//
//	stepbench -shape 50M -batch 4 -seq 128 -precision bf16
//	stepbench -shape 10M -batch 8 -seq 128 -curve 300
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/llama"
)

// shapes are the benchmark's models; scripts/gpu_torch_ref.py holds the
// same table.
var shapes = map[string]llama.Config{
	"10M":  {Vocab: 256, Context: 128, Width: 384, Layers: 6, Heads: 6, KVHeads: 2, Intermediate: 1024, RopeTheta: 10000, TiedHead: true},
	"50M":  {Vocab: 256, Context: 128, Width: 640, Layers: 11, Heads: 10, KVHeads: 5, Intermediate: 1728, RopeTheta: 10000, TiedHead: true},
	"125M": {Vocab: 32000, Context: 1024, Width: 768, Layers: 12, Heads: 12, KVHeads: 4, Intermediate: 2048, RopeTheta: 10000, TiedHead: true},
	"1B":   {Vocab: 128256, Context: 2048, Width: 2048, Layers: 16, Heads: 32, KVHeads: 8, Intermediate: 8192, RopeTheta: 500000, TiedHead: true},
}

type result struct {
	Impl          string    `json:"impl"`
	Shape         string    `json:"shape"`
	Batch         int       `json:"batch"`
	Seq           int       `json:"seq"`
	Precision     string    `json:"precision"`
	TokensPerS    float64   `json:"tokens_per_s,omitempty"`
	StepMS        float64   `json:"step_ms,omitempty"`
	TransferMS    float64   `json:"transfer_ms,omitempty"`
	ComputeTokens float64   `json:"compute_tokens_per_s,omitempty"`
	Params        int       `json:"params"`
	FLOPsPerToken float64   `json:"flops_per_token"`
	PeakMemBytes  int64     `json:"peak_mem_bytes,omitempty"`
	Device        string    `json:"device"`
	CurveSteps    int       `json:"curve_steps,omitempty"`
	CurveMaxGap   float64   `json:"curve_max_rel_gap,omitempty"`
	CurveFinal    []float64 `json:"curve_final_fp32_bf16,omitempty"`
	Error         string    `json:"error,omitempty"`
}

func main() {
	shape := flag.String("shape", "50M", "model shape: 10M, 50M, 125M or 1B")
	batch := flag.Int("batch", 4, "sequences per step")
	seq := flag.Int("seq", 128, "tokens per sequence (at most the shape's context)")
	prec := flag.String("precision", "fp32", "matrix products: fp32 or bf16")
	warmup := flag.Int("warmup", 3, "untimed steps first")
	steps := flag.Int("steps", 10, "timed steps")
	curve := flag.Int("curve", 0, "train this many steps at fp32 and at bf16 and compare the loss curves")
	flag.Parse()

	cfg, ok := shapes[*shape]
	p, err := kernels.ParsePrecision(*prec)
	res := result{Impl: "psyche", Shape: *shape, Batch: *batch, Seq: *seq, Precision: string(p),
		Params: cfg.NumParams(), FLOPsPerToken: cfg.FLOPsPerToken(*seq)}
	switch {
	case !ok:
		err = fmt.Errorf("unknown shape %q", *shape)
	case *seq < 1 || *seq > cfg.Context || *batch < 1:
		err = fmt.Errorf("batch %d × seq %d does not fit the shape (context %d)", *batch, *seq, cfg.Context)
	}
	if err == nil {
		err = func() (err error) {
			// The CUDA backend panics on device failures (out of memory
			// among them): report them as the result's error.
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("%v", r)
				}
			}()
			if *curve > 0 {
				return runCurve(&res, cfg, *batch, *seq, *curve)
			}
			return run(&res, cfg, p, *batch, *seq, *warmup, *steps)
		}()
	}
	if err != nil {
		res.Error = err.Error()
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if err != nil {
		os.Exit(1)
	}
}

func device(be kernels.Backend) string {
	if d, ok := be.(interface{ Device() string }); ok {
		return d.Device()
	}
	return be.Name()
}

func run(res *result, cfg llama.Config, p kernels.Precision, batch, seq, warmup, steps int) error {
	be, got := kernels.WithPrecision(kernels.Default(), p)
	res.Precision, res.Device = string(got), device(be)
	m, err := llama.New(cfg, 1, be)
	if err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(1, 1))
	in, tg := make([]uint32, batch*seq), make([]uint32, batch*seq)
	for i := range in {
		in[i], tg[i] = uint32(r.IntN(cfg.Vocab)), uint32(r.IntN(cfg.Vocab))
	}
	step := func() error {
		if _, err := m.Forward(in, tg, batch, seq); err != nil {
			return err
		}
		m.ZeroGrad()
		return m.Backward() // ends by reading the gradients back: the step is over
	}
	for i := 0; i < warmup; i++ {
		if err := step(); err != nil {
			return err
		}
	}
	start := time.Now()
	for i := 0; i < steps; i++ {
		if err := step(); err != nil {
			return err
		}
	}
	sec := time.Since(start).Seconds() / float64(steps)
	res.StepMS = sec * 1e3
	res.TokensPerS = float64(batch*seq) / sec
	// What a step spends moving the parameters up and the gradients down
	// (until the optimizer runs on the device), timed on its own.
	t0 := time.Now()
	for i := 0; i < 3; i++ {
		m.ToBackend()
		m.FromBackend()
	}
	transfer := time.Since(t0).Seconds() / 3
	res.TransferMS = transfer * 1e3
	if sec > transfer {
		res.ComputeTokens = float64(batch*seq) / (sec - transfer)
	}
	if free, total, ok := kernels.DeviceMemory(be); ok {
		res.PeakMemBytes = total - free
	}
	return nil
}

// corpus is a stream of bytes from a fixed random Markov chain in which
// each byte has four likely successors: learnable, with a floor well
// below the uniform loss of ln 256.
func corpus(n int) []uint32 {
	r := rand.New(rand.NewPCG(7, 7))
	var next [256][4]uint32
	for i := range next {
		for j := range next[i] {
			next[i][j] = uint32(r.IntN(256))
		}
	}
	out := make([]uint32, n)
	for i := 1; i < n; i++ {
		if r.IntN(10) == 0 {
			out[i] = uint32(r.IntN(256))
		} else {
			out[i] = next[out[i-1]][r.IntN(4)]
		}
	}
	return out
}

// runCurve trains from the same initial weights on the same batches with
// AdamW at fp32 and at bf16, and records the largest relative gap between
// the two curves' 20-step means.
func runCurve(res *result, cfg llama.Config, batch, seq, steps int) error {
	if cfg.Vocab != 256 {
		return fmt.Errorf("the loss curve runs on the byte-vocabulary shapes (10M, 50M)")
	}
	data := corpus(steps*batch*(seq+1) + 1)
	var curves [2][]float64
	for k, p := range []kernels.Precision{kernels.FP32, kernels.BF16} {
		be, got := kernels.WithPrecision(kernels.Default(), p)
		res.Device = device(be)
		if got != p {
			return fmt.Errorf("the %s backend computes in %s only", be.Name(), got)
		}
		m, err := llama.New(cfg, 1, be)
		if err != nil {
			return err
		}
		var sizes []int
		for _, t := range m.Tensors() {
			sizes = append(sizes, len(t))
		}
		opt := distro.NewAdamW(sizes, 0.9, 0.95, 1e-8, 0)
		in, tg := make([]uint32, batch*seq), make([]uint32, batch*seq)
		for s := 0; s < steps; s++ {
			for b := 0; b < batch; b++ {
				off := (s*batch + b) * (seq + 1)
				copy(in[b*seq:(b+1)*seq], data[off:off+seq])
				copy(tg[b*seq:(b+1)*seq], data[off+1:off+seq+1])
			}
			loss, err := m.Forward(in, tg, batch, seq)
			if err != nil {
				return err
			}
			m.ZeroGrad()
			if err := m.Backward(); err != nil {
				return err
			}
			if err := opt.Step(m.Tensors(), m.GradTensors(), 1e-3); err != nil {
				return err
			}
			curves[k] = append(curves[k], float64(loss))
		}
	}
	const window = 20
	fmt.Fprintf(os.Stderr, "%6s %10s %10s %8s\n", "steps", "fp32", "bf16", "gap")
	for lo := 0; lo+window <= steps; lo += window {
		var a, b float64
		for i := lo; i < lo+window; i++ {
			a += curves[0][i] / window
			b += curves[1][i] / window
		}
		gap := math.Abs(b-a) / a
		res.CurveMaxGap = max(res.CurveMaxGap, gap)
		res.CurveFinal = []float64{a, b}
		fmt.Fprintf(os.Stderr, "%6d %10.4f %10.4f %7.3f%%\n", lo+window, a, b, 100*gap)
	}
	res.CurveSteps = steps
	return nil
}
