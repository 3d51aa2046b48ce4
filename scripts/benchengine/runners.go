package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/goengine"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

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
	if res.Error != "" || res.Skipped != "" {
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
		if res.Error == "" && res.Skipped == "" {
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
	plan   *distro.Plan // the node's: it combines each round
	others []*distro.Frame
}

func (er *engineRunner) openEngine(ctx context.Context, op engine.Opener, m runmodel.Model) {
	t0 := time.Now()
	w, err := runmodel.HostWeights(m)
	if err != nil {
		er.r.Error = "open: " + err.Error()
		return
	}
	e, err := op.Open(ctx, engine.Spec{Weights: w, Optimizer: er.s.opts, Timeout: 30 * time.Minute})
	if err != nil {
		er.r.Error = "open: " + err.Error()
		return
	}
	er.r.OpenS = time.Since(t0).Seconds()
	er.r.Name = e.Name()
	er.e = e
	if er.plan, err = distro.NewPlan(e.Shapes(), er.s.opts); err != nil {
		er.r.Error = err.Error()
		return
	}
	if er.others, err = peerFrames(er.plan, er.s.peers-1); err != nil {
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
	// As a node does: the round combined once, then applied.
	c, err := er.plan.Combine(append([]*distro.Frame{f}, er.others...))
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("combine: %w", err)
	}
	if err := er.e.Apply(ctx, c, er.s.lr); err != nil {
		return 0, 0, 0, 0, fmt.Errorf("apply: %w", err)
	}
	t3 := time.Now()
	return l.Mean, t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), nil
}

type torchRunner struct {
	engineRunner
	compile bool
	ranks   bool // over the settings' devices
	shard   bool // ranks with placement shard (FSDP2)
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
	if tr.shard {
		tr.r.Engine = "torch-shard"
		opts = append(opts, torch.WithPlacement("shard"))
	}
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
	if tr.shard && tr.e == nil && notShardedYet(errors.New(tr.r.Error)) {
		tr.r.Skipped, tr.r.Error = tr.r.Error, ""
		logf("torch-shard: skipped: %s", tr.r.Skipped)
		return
	}
	if tr.e != nil {
		if p, ok := tr.e.(torch.Probe); ok {
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
	if m, ok := tr.e.(torch.Probe); ok {
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
	gr.openEngine(ctx, goengine.New(be), m)
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
	rr.r.SameWeights = s.weightsPath != "" || s.tf != nil
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
