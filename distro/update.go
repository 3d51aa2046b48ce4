package distro

import (
	"fmt"
	"math"
)

// UpdateRule is how Apply turns a tile of the decoded aggregate (the
// combined coefficients after the inverse DCT) into the step it takes. Like
// Aggregation it would be consensus (every trainer must use the same rule),
// but runs have no field for it: a run's trainers always use UpdateSign,
// DeMo's rule, and the others are experiments of psyche parity (--update),
// which found none of them better than sign (docs/benchmarks.md, "DisTrO vs AdamW").
// The stateless rules read only the aggregate, which every trainer of a
// round computes bit for bit the same; UpdateAdam keeps state.
type UpdateRule uint8

const (
	// UpdateSign is DeMo's rule and the zero value: every parameter moves
	// by ±lr (0 where the aggregate is exactly 0).
	UpdateSign UpdateRule = iota
	// UpdateRMS steps along the aggregate itself, scaled per tile so that
	// its root mean square is 1 (as sign's is): the tile's low-frequency
	// direction without the high-frequency noise that sign() adds, and
	// parameters the aggregate barely moves move little. A tile whose
	// aggregate is all zero does not move. The mean square is summed in
	// float64 in tile order, so the scale is the same on every machine.
	UpdateRMS
	// UpdateRMSClip is UpdateRMS with every value clamped to [−1, 1]: no
	// parameter moves by more than lr (as under sign), and parameters on
	// which the aggregate is small move less than lr.
	UpdateRMSClip
	// UpdateAdam treats the decoded aggregate a as a gradient for Adam
	// (β1 0.9, β2 0.95, bias-corrected, ε 1e-12) kept by Apply: the step is
	// m̂/(√v̂+ε), so parameters whose aggregate keeps flipping sign move
	// less than lr while consistent ones move about lr. It is the one
	// stateful rule: two parameter-sized buffers that every trainer must
	// have built from the same rounds (a trainer that joins late lacks
	// them), so it is an experiment of psyche parity, not a run option.
	UpdateAdam
	numUpdateRules
)

var updateRuleNames = [...]string{"sign", "rms", "rms-clip", "adam"}

// String is the rule's name in run files.
func (u UpdateRule) String() string {
	if u < numUpdateRules {
		return updateRuleNames[u]
	}
	return fmt.Sprintf("UpdateRule(%d)", uint8(u))
}

// ParseUpdateRule returns the rule a run file names.
func ParseUpdateRule(name string) (UpdateRule, bool) {
	for i, n := range updateRuleNames {
		if n == name {
			return UpdateRule(i), true
		}
	}
	return 0, false
}

// UpdateRuleNames lists the rules' names, in enum order.
func UpdateRuleNames() []string { return updateRuleNames[:] }

// direction replaces a decoded tile by the step direction of rule u.
func (u UpdateRule) direction(tile []float32) {
	switch u {
	case UpdateRMS:
		rmsNormalize(tile)
	case UpdateRMSClip:
		rmsNormalize(tile)
		for j, v := range tile {
			tile[j] = max(-1, min(1, v))
		}
	case UpdateAdam:
		// the raw aggregate: Apply keeps the moments
	default:
		signs(tile)
	}
}

// rmsNormalize scales v to a root mean square of 1 (all-zero v stays zero).
// Each square is converted explicitly so that no compiler fuses it into a
// multiply-add and changes the bits on some machines.
func rmsNormalize(v []float32) {
	var s float64
	for _, x := range v {
		s += float64(float64(x) * float64(x))
	}
	if s == 0 || len(v) == 0 {
		return
	}
	scale := float32(math.Sqrt(float64(len(v)) / s))
	for j := range v {
		v[j] *= scale
	}
}

// Adam constants of UpdateAdam.
const (
	adamBeta1 = 0.9
	adamBeta2 = 0.95
	adamEps   = 1e-12
)

// applyAdam is Apply under UpdateAdam: the decoded aggregate of the frames
// is the gradient of one Adam step.
func (d *DeMo) applyAdam(params [][]float32, frames []*Frame, lr float32) error {
	if d.adamM == nil {
		for _, p := range d.plans {
			d.adamM = append(d.adamM, make([]float32, p.params))
			d.adamV = append(d.adamV, make([]float32, p.params))
			d.adamA = append(d.adamA, make([]float32, p.params))
		}
	}
	if err := d.aggregate(d.adamA, frames, func(dst []float32, at int, dir []float32) { copy(dst[at:], dir) }); err != nil {
		return err
	}
	d.adamT++
	c1 := float32(1 - math.Pow(adamBeta1, float64(d.adamT)))
	c2 := float32(1 - math.Pow(adamBeta2, float64(d.adamT)))
	keep := 1 - lr*d.opts.WeightDecay
	for i, p := range params {
		m, v, a := d.adamM[i], d.adamV[i], d.adamA[i]
		for j, g := range a {
			m[j] = adamBeta1*m[j] + float32(1-adamBeta1)*g
			v[j] = adamBeta2*v[j] + float32(1-adamBeta2)*float32(g*g)
			step := (m[j] / c1) / (float32(math.Sqrt(float64(v[j]/c2))) + adamEps)
			p[j] = p[j]*keep - lr*step
		}
	}
	return nil
}
