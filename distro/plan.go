package distro

import "fmt"

// Plan is what a run's DisTrO optimizer is apart from any trainer's state:
// the options and how each tensor is cut into tiles. It checks and sizes
// frames and combines a round's frames under the run's aggregation rule
// (Combine), so every engine, whether it keeps the parameters here or
// elsewhere (a PyTorch worker on a GPU), applies an aggregate whose every
// decision was made once, in Go (ApplyCombined, or its transcription on a
// device). A DeMo holds one (DeMo.Plan); NewPlan makes one alone.
//
// A Plan never changes once made (a run whose rule changed while it was
// paused gets a new plan): every method may be called from several
// goroutines at once.
type Plan struct {
	opts  Options
	plans []*tensorPlan
}

// plan is Plan under a name that a DeMo embeds it by: its methods are
// DeMo's, and the field does not take the name of DeMo's Plan method.
type plan = Plan

// NewPlan returns the plan of a run with tensors of the given shapes. It
// refuses the options NewDeMo refuses.
func NewPlan(shapes [][]int, o Options) (*Plan, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	return newPlan(shapes, o)
}

// validate refuses options no run may have.
func (o *Options) validate() error {
	if o.Chunk <= 0 || o.TopK <= 0 {
		return fmt.Errorf("distro: chunk (%d) and top-k (%d) must be positive", o.Chunk, o.TopK)
	}
	if !(o.Decay >= 0 && o.Decay < 1) || !(o.WeightDecay >= 0) || !(o.ClipGradNorm >= 0) {
		return fmt.Errorf("distro: need 0 ≤ decay < 1, weight decay ≥ 0 and clip ≥ 0")
	}
	if o.Aggregation >= numAggregations {
		return fmt.Errorf("distro: unknown aggregation %d (want one of %v)", o.Aggregation, AggregationNames())
	}
	if o.Update >= numUpdateRules {
		return fmt.Errorf("distro: unknown update rule %d (want one of %v)", o.Update, UpdateRuleNames())
	}
	return nil
}

// newPlan cuts the tensors without checking the options.
func newPlan(shapes [][]int, o Options) (*Plan, error) {
	p := &Plan{opts: o}
	for _, s := range shapes {
		tp, err := newTensorPlan(s, o.Chunk, o.TopK)
		if err != nil {
			return nil, err
		}
		p.plans = append(p.plans, tp)
	}
	return p, nil
}

// Options returns the run's options.
func (p *Plan) Options() Options { return p.opts }

// Shapes returns the shapes of the tensors the plan cuts, in order.
func (p *Plan) Shapes() [][]int {
	out := make([][]int, len(p.plans))
	for i, tp := range p.plans {
		out[i] = append([]int(nil), tp.shape...)
	}
	return out
}

// TileLayout is how one tensor is cut into tiles, for an engine that cuts
// it itself. The tensor (Shape) is viewed as Outer × Rows × Cols (all
// leading dimensions folded into Outer; a 1-D tensor is 1 × 1 × n), and
// tiles are the TileH × TileW blocks of the last two: there are
// Outer·(Rows/TileH)·(Cols/TileW) of them, tile t = (o·Rows/TileH +
// tr)·Cols/TileW + tc covering rows tr·TileH… and columns tc·TileW… of
// slice o. A coefficient's index within its tile is row-major: kh·TileW +
// kw. K coefficients of every tile are sent.
type TileLayout struct {
	Shape             []int
	Outer, Rows, Cols int
	TileH, TileW, K   int
}

// Tiles is the number of tiles of the tensor.
func (l TileLayout) Tiles() int { return l.Outer * (l.Rows / l.TileH) * (l.Cols / l.TileW) }

// Layouts returns the layout of every tensor, in order.
func (p *Plan) Layouts() []TileLayout {
	out := make([]TileLayout, len(p.plans))
	for i, tp := range p.plans {
		out[i] = TileLayout{Shape: append([]int(nil), tp.shape...), Outer: tp.outer, Rows: tp.rows, Cols: tp.cols,
			TileH: tp.th, TileW: tp.tw, K: tp.k}
	}
	return out
}

// Keep is the factor Apply multiplies every parameter by before it
// subtracts lr·direction: 1 − lr·wd in float32, the product rounded to
// float32 before the subtraction (two roundings, never a fused
// multiply-add). An engine that applies the update itself computes
// θ·Keep(lr) rounded to float32, then subtracts lr·s (exact: s is −1, 0 or
// +1), to get Apply's bits.
func (p *Plan) Keep(lr float32) float32 {
	return 1 - float32(lr*p.opts.WeightDecay)
}

func (p *Plan) checkTensors(what string, ts [][]float32) error {
	if len(ts) != len(p.plans) {
		return fmt.Errorf("distro: %d %s tensors, the model has %d", len(ts), what, len(p.plans))
	}
	for i, tp := range p.plans {
		if len(ts[i]) != tp.params {
			return fmt.Errorf("distro: %s tensor %d has %d values, shape %v needs %d", what, i, len(ts[i]), tp.shape, tp.params)
		}
	}
	return nil
}

// Check reports whether a received frame fits this model; frames that do not
// must be ignored before Apply.
func (p *Plan) Check(f *Frame) error {
	if len(f.Tensors) != len(p.plans) {
		return fmt.Errorf("%w: %d tensors, the model has %d", ErrMismatch, len(f.Tensors), len(p.plans))
	}
	for i, tp := range p.plans {
		if err := tp.matches(&f.Tensors[i]); err != nil {
			return fmt.Errorf("tensor %d: %w", i, err)
		}
	}
	return p.checkQuantization(f)
}
