package distro

import (
	"errors"
	"math"
)

// Options are the DisTrO hyper-parameters of a run (the coordinator's
// optimizer config) plus how many goroutines to use.
type Options struct {
	Chunk        int         // compression_chunk: tiles are at most Chunk×Chunk (e.g. 64)
	TopK         int         // compression_topk: coefficients kept per tile (e.g. 4)
	Quantize1Bit bool        // transmit signs instead of float32 values
	RiceIndices  bool        // send indices as Rice codes of their gaps (smaller than fixed widths)
	Decay        float32     // compression_decay β of the momentum (e.g. 0.999)
	WeightDecay  float32     // decoupled weight decay, applied as θ *= 1 − lr·wd
	ClipGradNorm float32     // clip the global gradient norm to this (0: off)
	Aggregation  Aggregation // how Apply combines the peers' results (zero value: AggregateRobust)
	Update       UpdateRule  // how Apply turns the decoded aggregate into a step (zero value: UpdateSign)
	// NormalizeRMS divides each gradient coefficient, in the DCT domain,
	// by the root of its own running mean square before it enters the
	// momentum (see normalizeTile). false is DeMo's raw gradient.
	NormalizeRMS bool
	Workers      int // goroutines for compression and aggregation (0: 1)
}

// ErrNonFinite reports a gradient with NaN or Inf in it.
var ErrNonFinite = errors.New("distro: gradient is not finite")

// DeMo is one trainer's DisTrO optimizer state (decoupled momentum).
//
// A step is: δ ← β·δ + lr·g; q = TopK(DCT(δ)) per tile (with
// Options.NormalizeRMS, each coefficient of DCT(g) is first divided by its
// own running RMS); δ −= IDCT(q) (the residual keeps what was not sent,
// using the unquantized values); q is transmitted, each float value within
// ±MaxValue (the excess of one beyond it stays in δ). Applying a set of
// results combines every peer's q into dense tiles (Options.Aggregation: by
// default a robust rule, or Psyche's average of duplicate indices), inverts
// the DCT, takes the sign (or, with Options.Update = UpdateRMS, scales each
// tile to unit RMS), and updates θ ← θ·(1 − lr·wd) − lr·sign.
//
// The momentum is kept in the DCT domain, tile by tile. The DCT is orthonormal
// and linear, so DCT(β·δ + lr·g) = β·DCT(δ) + lr·DCT(g) and subtracting
// IDCT(q) from δ is zeroing the sent coefficients: the same optimizer, with
// one transform per step instead of three.
//
// A DeMo holds its run's Plan (DeMo.Plan) and has all of the Plan's methods
// (Options, Check, Limits, MaxFrameBytes, Layouts, Keep, Aggregate,
// Combine, ApplyCombined, FrameOf); what it adds is one trainer's state.
type DeMo struct {
	*plan             // the options and the tensors' tiles; its methods are DeMo's
	delta [][]float32 // per tensor, tile-major: tile t at [t*tileSize, (t+1)*tileSize)
	// UpdateAdam's moments, the decoded aggregate's buffer, steps taken
	adamM, adamV, adamA [][]float32
	adamT               int
	// NormalizeRMS's running mean squares (per tensor, tile-major like
	// delta) and the steps they have seen, for the bias correction
	meanSq [][]float32
	steps  int
}

// NewDeMo returns a zero optimizer state for tensors of the given shapes.
func NewDeMo(shapes [][]int, o Options) (*DeMo, error) {
	p, err := NewPlan(shapes, o)
	if err != nil {
		return nil, err
	}
	d := &DeMo{plan: p}
	for _, tp := range p.plans {
		d.delta = append(d.delta, make([]float32, tp.params))
		if o.NormalizeRMS {
			d.meanSq = append(d.meanSq, make([]float32, tp.params))
		}
	}
	return d, nil
}

// Plan returns the run's plan this optimizer follows.
func (d *DeMo) Plan() *Plan { return d.plan }

// Momentum returns the momentum of tensor i in the DCT domain (tile-major).
func (d *DeMo) Momentum(i int) []float32 { return d.delta[i] }

// GradNorm is the global L2 norm of grads.
func GradNorm(grads [][]float32) float64 {
	var s float64
	for _, g := range grads {
		for _, v := range g {
			s += float64(v) * float64(v)
		}
	}
	return math.Sqrt(s)
}

// Step folds grads into the momentum and returns the compressed result to
// transmit. grads are not modified.
func (d *DeMo) Step(grads [][]float32, lr float32) (*Frame, error) {
	if err := d.checkTensors("gradient", grads); err != nil {
		return nil, err
	}
	scale := lr
	if d.opts.ClipGradNorm > 0 {
		if norm := GradNorm(grads); norm > float64(d.opts.ClipGradNorm) {
			scale = float32(float64(lr) * float64(d.opts.ClipGradNorm) / norm)
		}
	}
	for _, g := range grads {
		if !allFinite(g) {
			return nil, ErrNonFinite
		}
	}
	f := &Frame{Tensors: make([]Tensor, len(d.plans))}
	d.steps++
	for i, p := range d.plans {
		t := &f.Tensors[i]
		*t = Tensor{Shape: append([]int(nil), p.shape...), TileH: p.th, TileW: p.tw, K: p.k, Quantized: d.opts.Quantize1Bit, RiceIndices: d.opts.RiceIndices,
			Indices: make([]uint32, p.tiles()*p.k), Values: make([]float32, p.tiles()*p.k)}
		var meanSq []float32
		if d.meanSq != nil {
			meanSq = d.meanSq[i]
		}
		d.compressTensor(p, d.delta[i], meanSq, grads[i], t, scale)
	}
	return f, nil
}

func allFinite(v []float32) bool {
	for _, x := range v {
		if math.Float32bits(x)&0x7f800000 == 0x7f800000 {
			return false
		}
	}
	return true
}

// compressTensor runs the step on every tile of one tensor. meanSq is nil
// unless the gradient is normalized.
func (d *DeMo) compressTensor(p *tensorPlan, delta, meanSq, g []float32, out *Tensor, scale float32) {
	ts, k := p.tileSize(), p.k
	beta, quantize := d.opts.Decay, d.opts.Quantize1Bit
	unbias := float32(1 / (1 - math.Pow(normBeta, float64(d.steps))))
	parallel(d.opts.Workers, p.tiles(), func(lo, hi int) {
		tile, tmp := make([]float32, ts), make([]float32, ts)
		mag := make([]uint32, k)
		for t := lo; t < hi; t++ {
			p.gather(tile, g, t)
			p.dct.forward(tile, tmp)
			if meanSq != nil {
				normalizeTile(tile, meanSq[t*ts:(t+1)*ts], unbias)
			}
			m := delta[t*ts : (t+1)*ts]
			momentum(m, tile, beta, scale)
			idx := out.Indices[t*k : (t+1)*k]
			vals := out.Values[t*k : (t+1)*k]
			topK(m, idx, mag)
			for j, ix := range idx {
				// The residual keeps everything but what is sent,
				// unquantized; a float value beyond MaxValue is sent as
				// ±MaxValue and the excess kept (v − v is +0).
				v := m[ix]
				if quantize {
					m[ix] = 0
					vals[j] = signBit(v)
					continue
				}
				sent := max(-MaxValue, min(MaxValue, v))
				m[ix] = v - sent
				vals[j] = sent
			}
		}
	})
}

// The constants of NormalizeRMS, chosen by experiment (docs/benchmarks.md, "DisTrO vs
// AdamW"): the decay of the mean squares is AdamW's β2, and a coefficient's
// divisor never falls below normFloor times the tile's typical one, so a
// coefficient that has been near zero is not amplified into noise.
const (
	normBeta  = 0.95
	normFloor = 0.1
)

// normalizeTile folds one tile's gradient coefficients c into their running
// mean squares v and divides each by the root of its own (bias-corrected by
// unbias = 1/(1 − β^steps), as Adam's second moment), plus normFloor times
// the root of the tile's mean. Top-k then picks the coefficients whose
// momentum is large against their own scale, not the largest raw ones: the
// low frequencies, whose raw gradients are largest, no longer take every
// slot. A tile whose coefficients have all been exactly zero stays zero.
func normalizeTile(c, v []float32, unbias float32) {
	// The running squares are computed in float64: those of small
	// gradients lose bits, or vanish, in float32 (only what is kept
	// between steps is rounded to it).
	var sums [4]float64
	meanSquare(v[:len(c)], c, normBeta, 1-normBeta, &sums)
	total := (sums[0] + sums[1]) + (sums[2] + sums[3])
	floor := float32(normFloor * math.Sqrt(total/float64(len(c))*float64(unbias)))
	if floor == 0 { // every coefficient is, and has been, zero (or below float32's range)
		clear(c)
		return
	}
	rmsDivide(c, v, unbias, floor) // every divisor is at least floor > 0
}

// signs replaces each value by its sign: −1, 0 or +1 (branch-free: the
// values are dense and their signs random, which defeats branch prediction).
func signs(v []float32) {
	for j, x := range v {
		b := math.Float32bits(x)
		nonzero := (b&0x7fffffff + 0x7fffffff) >> 31 // 1 unless ±0
		v[j] = math.Float32frombits((b&0x80000000 | 0x3f800000) * nonzero)
	}
}

// signBit maps a value to the ±1 it is transmitted as (zero counts as +1).
func signBit(v float32) float32 {
	if v < 0 {
		return -1
	}
	return 1
}

// Aggregate writes to out the update direction of a set of results: for every
// tile, the frames' coefficients combined by the run's aggregation rule,
// inverse DCT, sign (−1, 0 or +1; under the experimental update rules, the
// tile scaled to unit RMS, clamped, or raw for UpdateAdam). The result is the same, bit for bit,
// whatever the order of frames.
func (p *Plan) Aggregate(out [][]float32, frames []*Frame) error {
	return p.aggregate(out, frames, func(dst []float32, at int, dir []float32) { copy(dst[at:], dir) })
}

// Apply updates params with a set of results (the consensus results of a
// round, in any order): θ ← θ·(1 − lr·wd) − lr·sign(aggregate) (or the
// run's Options.Update instead of sign).
func (d *DeMo) Apply(params [][]float32, frames []*Frame, lr float32) error {
	if d.opts.Update == UpdateAdam {
		if err := d.checkTensors("parameter", params); err != nil {
			return err
		}
		return d.applyAdam(params, frames, lr)
	}
	keep := d.Keep(lr)
	return d.aggregate(params, frames, func(dst []float32, at int, dir []float32) {
		row := dst[at : at+len(dir)]
		for j, s := range dir {
			// θ·keep rounded before the subtraction: no fused
			// multiply-add, on any machine (see Plan.Keep)
			row[j] = float32(row[j]*keep) - lr*s
		}
	})
}
