// Package parity runs the DisTrO-versus-AdamW experiment: the same model on
// the same tokens, trained (a) with AdamW on one node and (b) with the DisTrO
// optimizer on simulated peers that each take a share of every batch and
// exchange only encoded frames, and reports validation loss at equal tokens,
// bytes sent and throughput.
package parity

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/schedule"
)

// Sequences supplies training sequences of SeqLen+1 tokens by index.
type Sequences interface {
	// Sequence writes sequence index into dst and returns dst[:SeqLen+1].
	Sequence(ctx context.Context, index uint64, dst []uint32) ([]uint32, error)
}

// Config is one experiment.
type Config struct {
	Model       gpt.Config
	SeqLen      int     // tokens per sequence (≤ Model.Context)
	Batch       int     // sequences per step, over all peers
	Peers       int     // simulated DisTrO peers; Batch must be a multiple
	Steps       int     // optimizer steps of each run
	WarmupSteps int     // linear learning-rate warmup, then cosine decay to 10%
	AdamLR      float32 // peak learning rate of AdamW
	DistroLR    float32 // peak learning rate of DisTrO
	// AdamFinalLR and DistroFinalLR are each optimizer's rate at the last
	// step as a fraction of its peak (nil: a tenth). A run sets the same
	// with its schedule's final rate.
	AdamFinalLR, DistroFinalLR *float32
	Distro                     distro.Options
	// DisTrO learning-rate multipliers of the embeddings (wte, wpe) and of
	// the vectors (layer norms, biases); 0 means 1. An experiment of this
	// command only: a run has one learning rate for every tensor.
	EmbedLRScale, VectorLRScale float32
	// MomentumLR is the rate at which DisTrO folds gradients into its
	// momentum (DeMo's δ ← β·δ + lr·g); the step always moves by the
	// scheduled rate. An experiment of this command only: with the
	// scheduled rate inside the momentum, a decaying schedule lets the
	// residual of earlier, larger-rate steps outweigh new gradients, so the
	// direction lags during the decay.
	MomentumLR MomentumLR
	EvalEvery  int // steps between validation evaluations
	EvalSeqs   int // validation sequences per evaluation
	Seed       uint64
}

// DefaultDistroLR is the peak DisTrO learning rate psyche parity uses for a
// model of the given width: 0.256/width (4e-3 at width 64, 2e-3 at 128,
// 6.7e-4 at 384). Sign descent moves every parameter by the rate, so the
// change of a layer's output grows with its fan-in: the best rate measured
// fell from 4e-3 at width 64 to 2e-3 at 128 and to about 5e-4–1e-3 at 384
// (docs/benchmarks.md, "DisTrO vs AdamW").
func DefaultDistroLR(width int) float64 { return 0.256 / float64(max(1, width)) }

// Row is one evaluation point.
type Row struct {
	Step       int
	Tokens     int64
	AdamLoss   float64 // validation loss
	DistroLoss float64
}

// Result is the outcome of both runs.
type Result struct {
	Rows               []Row
	Params             int
	FrameBytes         float64 // mean encoded frame size, per peer per step
	DenseBytes         float64 // a dense fp32 gradient, per peer per step
	AdamTokensPerSec   float64
	DistroTokensPerSec float64
	AdamGFLOPs         float64 // achieved by the training step
	DistroGFLOPs       float64
	MatmulGFLOPs       float64 // Gemm of the same build, measured in the same run
	Backend            string
}

// FinalRatio is DisTrO's validation loss over AdamW's at the last evaluation.
func (r *Result) FinalRatio() float64 {
	last := r.Rows[len(r.Rows)-1]
	return last.DistroLoss / last.AdamLoss
}

// Compression is how many times smaller a frame is than a dense fp32 gradient.
func (r *Result) Compression() float64 { return r.DenseBytes / r.FrameBytes }

func (c *Config) validate() error {
	switch {
	case c.Peers <= 0 || c.Batch <= 0 || c.Batch%c.Peers != 0:
		return fmt.Errorf("parity: batch (%d) must be a positive multiple of peers (%d)", c.Batch, c.Peers)
	case c.SeqLen <= 0 || c.SeqLen > c.Model.Context:
		return fmt.Errorf("parity: sequence length %d must be in [1, %d]", c.SeqLen, c.Model.Context)
	case c.Steps <= 0 || c.EvalEvery <= 0 || c.EvalSeqs <= 0:
		return fmt.Errorf("parity: steps, eval interval and eval sequences must be positive")
	}
	return c.Model.Validate()
}

// lr is the rate of 0-based step: linear warmup, then cosine decay to a
// tenth of the peak at the last step.
func (c *Config) lr(peak float32, step int) float32 {
	return c.lrTo(peak, peak/10, step)
}

// distroLR is DisTrO's rate at step: as lr, decaying to
// DistroFinalLR·peak when that is set.
func (c *Config) distroLR(step int) float32 {
	if c.DistroFinalLR != nil {
		return c.lrTo(c.DistroLR, c.DistroLR**c.DistroFinalLR, step)
	}
	return c.lr(c.DistroLR, step)
}

// adamLR is AdamW's rate at step: as lr, decaying to AdamFinalLR·peak when
// that is set.
func (c *Config) adamLR(step int) float32 {
	if c.AdamFinalLR != nil {
		return c.lrTo(c.AdamLR, c.AdamLR**c.AdamFinalLR, step)
	}
	return c.lr(c.AdamLR, step)
}

func (c *Config) lrTo(peak, final float32, step int) float32 {
	s := coordinator.LRSchedule{Kind: coordinator.LRCosine, BaseLR: peak, FinalLR: final,
		WarmupSteps: uint32(c.WarmupSteps), DecaySteps: uint32(max(1, c.Steps-c.WarmupSteps))}
	return schedule.LR(s, uint32(step+1))
}

// MomentumLR says which rate scales the gradients DisTrO folds into its
// momentum.
type MomentumLR uint8

const (
	// MomentumScheduled is DeMo's: the scheduled rate of the step.
	MomentumScheduled MomentumLR = iota
	// MomentumPeak is the peak rate on every step.
	MomentumPeak
	// MomentumHeld is the scheduled rate during the warmup, then the peak:
	// the weight of new gradients never falls.
	MomentumHeld
	// MomentumSquared is the scheduled rate times its fraction of the peak:
	// new gradients lose weight against the residual faster than the step
	// shrinks.
	MomentumSquared
)

var momentumLRNames = [...]string{"scheduled", "peak", "held", "squared"}

// ParseMomentumLR returns the MomentumLR a flag names.
func ParseMomentumLR(name string) (MomentumLR, error) {
	for i, n := range momentumLRNames {
		if n == name {
			return MomentumLR(i), nil
		}
	}
	return 0, fmt.Errorf("parity: momentum rate %q is none of %v", name, momentumLRNames[:])
}

func (m MomentumLR) String() string {
	if int(m) < len(momentumLRNames) {
		return momentumLRNames[m]
	}
	return fmt.Sprintf("MomentumLR(%d)", uint8(m))
}

// momentumLR is the rate DisTrO folds step's gradients into its momentum at.
func (c *Config) momentumLR(step int) float32 {
	switch {
	case c.MomentumLR == MomentumPeak, c.MomentumLR == MomentumHeld && step >= c.WarmupSteps:
		return c.DistroLR
	case c.MomentumLR == MomentumSquared:
		lr := c.distroLR(step)
		return lr * lr / c.DistroLR
	}
	return c.distroLR(step)
}

// loader turns sequence indices into model batches.
type loader struct {
	src    Sequences
	seqLen int
	buf    []uint32
}

func (l *loader) batch(ctx context.Context, first uint64, n int) (in, tg []uint32, err error) {
	t := l.seqLen
	in, tg = make([]uint32, n*t), make([]uint32, n*t)
	if cap(l.buf) < t+1 {
		l.buf = make([]uint32, t+1)
	}
	seq := l.buf[:t+1]
	for i := 0; i < n; i++ {
		got, err := l.src.Sequence(ctx, first+uint64(i), seq)
		if err != nil {
			return nil, nil, err
		}
		if len(got) != t+1 {
			return nil, nil, fmt.Errorf("parity: sequence %d has %d tokens, want %d", first+uint64(i), len(got), t+1)
		}
		seq = got
		copy(in[i*t:], seq[:t])
		copy(tg[i*t:], seq[1:t+1])
	}
	return in, tg, nil
}

func evaluate(ctx context.Context, m *gpt.Model, val *loader, seqs, chunk int) (float64, error) {
	var sum float64
	for done := 0; done < seqs; done += chunk {
		n := min(chunk, seqs-done)
		in, tg, err := val.batch(ctx, uint64(done), n)
		if err != nil {
			return 0, err
		}
		l, err := m.Forward(in, tg, n, val.seqLen)
		if err != nil {
			return 0, err
		}
		sum += float64(l) * float64(n)
	}
	return sum / float64(seqs), nil
}

// Run trains both models and reports. progress (may be nil) receives a line
// per evaluation.
func Run(ctx context.Context, cfg Config, train, val Sequences, progress io.Writer) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	adam, err := gpt.New(cfg.Model, cfg.Seed, nil)
	if err != nil {
		return nil, err
	}
	dmodel, _ := gpt.New(cfg.Model, cfg.Seed, nil) // same initial weights
	sizes := make([]int, 0)
	for _, t := range adam.Tensors() {
		sizes = append(sizes, len(t))
	}
	adamw := distro.NewAdamW(sizes, 0.9, 0.95, 1e-8, 0)
	adamw.ClipGradNorm = 1
	peers := make([]*distro.DeMo, cfg.Peers)
	for p := range peers {
		if peers[p], err = distro.NewDeMo(dmodel.Shapes(), cfg.Distro); err != nil {
			return nil, err
		}
	}
	res := &Result{Params: cfg.Model.NumParams(), Backend: adam.Backend().Name(),
		DenseBytes: 4 * float64(cfg.Model.NumParams())}
	groups := lrGroups(&cfg)
	before := make([][]float32, len(groups))
	tr := &loader{src: train, seqLen: cfg.SeqLen}
	vl := &loader{src: val, seqLen: cfg.SeqLen}
	share := cfg.Batch / cfg.Peers
	var adamTime, distroTime time.Duration
	var frameBytes float64
	tokensPerStep := int64(cfg.Batch * cfg.SeqLen)

	for step := 0; step < cfg.Steps; step++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		first := uint64(step * cfg.Batch)
		in, tg, err := tr.batch(ctx, first, cfg.Batch)
		if err != nil {
			return nil, err
		}
		// (a) AdamW, one node, the whole batch.
		start := time.Now()
		if _, err := adam.Forward(in, tg, cfg.Batch, cfg.SeqLen); err != nil {
			return nil, err
		}
		adam.ZeroGrad()
		if err := adam.Backward(); err != nil {
			return nil, err
		}
		if err := adamw.Step(adam.Tensors(), adam.GradTensors(), cfg.adamLR(step)); err != nil {
			return nil, err
		}
		adamTime += time.Since(start)

		// (b) DisTrO: each peer trains on its share and sends an encoded frame.
		start = time.Now()
		lr := cfg.distroLR(step)
		frames := make([]*distro.Frame, cfg.Peers)
		for p := range peers {
			lo, hi := p*share*cfg.SeqLen, (p+1)*share*cfg.SeqLen
			if _, err := dmodel.Forward(in[lo:hi], tg[lo:hi], share, cfg.SeqLen); err != nil {
				return nil, err
			}
			dmodel.ZeroGrad()
			if err := dmodel.Backward(); err != nil {
				return nil, err
			}
			f, err := peers[p].Step(dmodel.GradTensors(), cfg.momentumLR(step))
			if err != nil {
				return nil, err
			}
			wire, err := f.MarshalBinary()
			if err != nil {
				return nil, err
			}
			frameBytes += float64(len(wire))
			if frames[p], err = distro.DecodeFrame(wire, distro.DefaultLimits); err != nil {
				return nil, err
			}
		}
		if err := applyGrouped(&cfg, peers[0], dmodel.Tensors(), frames, lr, groups, before); err != nil {
			return nil, err
		}
		distroTime += time.Since(start)

		if (step+1)%cfg.EvalEvery == 0 || step+1 == cfg.Steps {
			chunk := max(1, cfg.Batch)
			a, err := evaluate(ctx, adam, vl, cfg.EvalSeqs, chunk)
			if err != nil {
				return nil, err
			}
			d, err := evaluate(ctx, dmodel, vl, cfg.EvalSeqs, chunk)
			if err != nil {
				return nil, err
			}
			row := Row{Step: step + 1, Tokens: int64(step+1) * tokensPerStep, AdamLoss: a, DistroLoss: d}
			res.Rows = append(res.Rows, row)
			fmt.Fprintf(progress, "step %4d  tokens %8d  val loss adamw %.4f  distro %.4f  (%.3fx)\n",
				row.Step, row.Tokens, a, d, d/a)
		}
	}
	total := float64(int64(cfg.Steps) * tokensPerStep)
	res.FrameBytes = frameBytes / float64(cfg.Steps*cfg.Peers)
	res.AdamTokensPerSec = total / adamTime.Seconds()
	res.DistroTokensPerSec = total / distroTime.Seconds()
	flops := cfg.Model.FLOPsPerToken(cfg.SeqLen)
	res.AdamGFLOPs = flops * res.AdamTokensPerSec / 1e9
	res.DistroGFLOPs = flops * res.DistroTokensPerSec / 1e9
	res.MatmulGFLOPs = MatmulGFLOPs(adam.Backend())
	return res, nil
}

// lrGroups is each tensor's learning-rate multiplier (Config.EmbedLRScale,
// VectorLRScale), in Specs order.
func lrGroups(cfg *Config) []float32 {
	scale := func(s float32) float32 {
		if s == 0 {
			return 1
		}
		return s
	}
	var out []float32
	for _, s := range cfg.Model.Specs() {
		switch {
		case s.Name == "wte" || s.Name == "wpe":
			out = append(out, scale(cfg.EmbedLRScale))
		case strings.HasPrefix(s.Name, "ln") || strings.HasSuffix(s.Name, ".bias"):
			out = append(out, scale(cfg.VectorLRScale))
		default:
			out = append(out, 1)
		}
	}
	return out
}

// applyGrouped applies the round and then scales each tensor's change by its
// group's multiplier (before is scratch, one slice per tensor).
func applyGrouped(cfg *Config, d *distro.DeMo, params [][]float32, frames []*distro.Frame, lr float32, groups []float32, before [][]float32) error {
	for i, m := range groups {
		if m != 1 {
			before[i] = append(before[i][:0], params[i]...)
		}
	}
	if err := d.Apply(params, frames, lr); err != nil {
		return err
	}
	for i, m := range groups {
		if m != 1 {
			for j, b := range before[i] {
				params[i][j] = b + m*(params[i][j]-b)
			}
		}
	}
	return nil
}

// MatmulGFLOPs measures the backend's Gemm on 512×512 matrices.
func MatmulGFLOPs(be kernels.Backend) float64 {
	return kernels.GemmRate(be, 512, 512, 512, 1, 300*time.Millisecond)
}

// Print writes the result table.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "\n%8s %10s %14s %14s %8s\n", "step", "tokens", "adamw val", "distro val", "ratio")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "%8d %10d %14.4f %14.4f %8.3f\n", row.Step, row.Tokens, row.AdamLoss, row.DistroLoss, row.DistroLoss/row.AdamLoss)
	}
	fmt.Fprintf(w, "\nmodel: %d parameters, kernels: %s\n", r.Params, r.Backend)
	fmt.Fprintf(w, "bytes sent per peer per step: distro %.0f, dense fp32 gradient %.0f (%.0fx fewer)\n",
		r.FrameBytes, r.DenseBytes, r.Compression())
	fmt.Fprintf(w, "tokens/s: adamw %.0f, distro %.0f (4 peers simulated on this machine)\n", r.AdamTokensPerSec, r.DistroTokensPerSec)
	fmt.Fprintf(w, "achieved GFLOP/s: adamw %.1f, distro %.1f; matmul of this build %.1f (%.0f%% and %.0f%% of it)\n",
		r.AdamGFLOPs, r.DistroGFLOPs, r.MatmulGFLOPs, 100*r.AdamGFLOPs/r.MatmulGFLOPs, 100*r.DistroGFLOPs/r.MatmulGFLOPs)
	fmt.Fprintf(w, "final validation loss: distro/adamw = %.3f\n", r.FinalRatio())
}
