package distro

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestDecodeFrameValueBound: a float frame's values may be anything finite
// within ±MaxValue, the bound itself included; beyond it, up to float32's
// maximum, the frame is malformed, and the encoder refuses what the decoder
// refuses.
func TestDecodeFrameValueBound(t *testing.T) {
	above := math.Nextafter32(MaxValue, math.MaxFloat32)
	for _, tc := range []struct {
		name string
		v    float32
		ok   bool
	}{
		{"zero", 0, true},
		{"negative zero", float32(math.Copysign(0, -1)), true},
		{"smallest subnormal", math.SmallestNonzeroFloat32, true},
		{"an ordinary value", -0.0123, true},
		{"the bound", MaxValue, true},
		{"minus the bound", -MaxValue, true},
		{"just above the bound", above, false},
		{"just below minus the bound", -above, false},
		{"twice the bound", 2 * MaxValue, false},
		{"1e30", 1e30, false},
		{"float32's maximum", math.MaxFloat32, false},
		{"minus float32's maximum", -math.MaxFloat32, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &Frame{Tensors: []Tensor{{Shape: []int{16}, TileH: 1, TileW: 8, K: 2,
				Indices: []uint32{1, 5, 0, 7}, Values: []float32{0.5, tc.v, 2, -3}}}}
			_, err := f.MarshalBinary()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrFrame)) {
				t.Fatalf("encoding a value of %v: %v", tc.v, err)
			}
			// The bytes a peer could send: a valid frame with the value
			// written over another's.
			f.Tensors[0].Values[1] = 1
			b := f.mustMarshal(t)
			at := len(b) - 12
			binary.LittleEndian.PutUint32(b[at:], math.Float32bits(tc.v))
			g, err := DecodeFrame(b, DefaultLimits)
			switch {
			case tc.ok && (err != nil || math.Float32bits(g.Tensors[0].Values[1]) != math.Float32bits(tc.v)):
				t.Fatalf("decoding a value of %v: %v", tc.v, err)
			case !tc.ok && !errors.Is(err, ErrFrame):
				t.Fatalf("decoding a value of %v: %v, want ErrFrame", tc.v, err)
			}
		})
	}
}

// extremeGrads are gradients far beyond any honest training's: entries of
// ±1e15 (the squares of their DCT coefficients still fit the float32 mean
// squares NormalizeRMS keeps).
func extremeGrads(shapes [][]int, seed uint64) [][]float32 {
	g := randomTensors(rand.New(rand.NewPCG(seed, 7)), shapes, 1)
	for _, t := range g {
		for j := range t {
			t[j] = float32(math.Copysign(1e15, float64(t[j])))
		}
	}
	return g
}

// constant is a gradient of v everywhere: all of each tile's energy is in
// its DC coefficient.
func constant(shapes [][]int, v float32) [][]float32 {
	g := randomTensors(rand.New(rand.NewPCG(0, 0)), shapes, 0)
	for _, t := range g {
		for j := range t {
			t[j] = v
		}
	}
	return g
}

// TestHonestValuesWithinTheirBound: the values an honest Step sends at lr 1
// on gradients far beyond any training's stay within what MaxValue's
// comment derives for the run's settings — lr·√20/(1 − β) normalized,
// lr·clip/(1 − β) clipped, MaxValue itself with neither (Step clamps) — and
// reach it where the settings allow: a normalized coefficient that jumps
// from nothing late in a run, a clipped gradient all in one coefficient.
// Every frame decodes: no honest frame is refused.
func TestHonestValuesWithinTheirBound(t *testing.T) {
	tile := [][]int{{16, 16}}
	shapes := [][]int{{64, 64}, {96, 40}, {50}}
	const lr = 1
	for _, tc := range []struct {
		name        string
		shapes      [][]int
		o           Options
		steps       int
		grads       func(step int) [][]float32
		bound, near float64 // the settings' bound, and what the last step reaches
	}{
		// After 200 steps of a tiny gradient the bias correction is ~1 and
		// the mean square ~0: the jump is divided by little more than
		// √0.05·|c| (the floor adds a tenth of the tile's root mean
		// square, 1/16 of the DC): 99.4% of the bound.
		{"normalized, a late jump", tile, Options{Chunk: 16, TopK: 4, NormalizeRMS: true}, 201,
			func(step int) [][]float32 {
				if step < 200 {
					return constant(tile, 1e-10)
				}
				return constant(tile, 1e15)
			},
			lr * math.Sqrt(20), 0.99 * lr * math.Sqrt(20)},
		{"normalized, decay 0.5, at random", shapes, Options{Chunk: 16, TopK: 8, Decay: 0.5, NormalizeRMS: true}, 20,
			func(step int) [][]float32 { return extremeGrads(shapes, uint64(step)) }, lr * math.Sqrt(20) / 0.5, 0},
		{"clipped at 3, one coefficient", tile, Options{Chunk: 16, TopK: 4, ClipGradNorm: 3}, 1,
			func(int) [][]float32 { return constant(tile, 1e15) }, lr * 3, lr * 3},
		{"clipped at 3, decay 0.9, at random", shapes, Options{Chunk: 16, TopK: 8, Decay: 0.9, ClipGradNorm: 3}, 20,
			func(step int) [][]float32 { return extremeGrads(shapes, uint64(step)) }, lr * 3 / 0.1, 0},
		{"neither: clamped", shapes, Options{Chunk: 16, TopK: 8, Decay: 0.999}, 3,
			func(step int) [][]float32 { return extremeGrads(shapes, uint64(step)) }, MaxValue, MaxValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDeMo(tc.shapes, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			top := 0.0
			for step := range tc.steps {
				f, err := d.Step(tc.grads(step), lr)
				if err != nil {
					t.Fatal(err)
				}
				top = 0
				for _, ft := range f.Tensors {
					for _, v := range ft.Values {
						top = max(top, math.Abs(float64(v)))
					}
				}
				b, err := f.MarshalBinary()
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if _, err := DecodeFrame(b, d.Limits()); err != nil {
					t.Fatalf("step %d: an honest frame is refused: %v", step, err)
				}
			}
			// float32 rounding of the division and the momentum: ulps.
			if top > tc.bound*(1+1e-6) || top < tc.near*(1-1e-6) {
				t.Errorf("largest value %v, want within [%v, %v]", top, tc.near, tc.bound)
			}
			t.Logf("largest value of the last step %.6g; the settings' bound %.6g", top, tc.bound)
		})
	}
}

// TestStepClampsBeyondMaxValue: a momentum coefficient beyond MaxValue is
// sent as ±MaxValue and the excess stays in the residual (with its sign);
// one within it is sent whole and leaves +0.
func TestStepClampsBeyondMaxValue(t *testing.T) {
	shapes := [][]int{{32, 32}, {40}}
	d, err := NewDeMo(shapes, Options{Chunk: 16, TopK: 8, Decay: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	// One tensor's gradient at ±1e15, the other's at ±1: both kinds of
	// value at lr 1.
	g := extremeGrads(shapes, 1)
	for j := range g[1] {
		g[1][j] = float32(math.Copysign(1, float64(g[1][j])))
	}
	f, err := d.Step(g, 1)
	if err != nil {
		t.Fatal(err)
	}
	clamped, whole := 0, 0
	for i, ft := range f.Tensors {
		ts := ft.TileH * ft.TileW
		m := d.Momentum(i)
		for j, v := range ft.Values {
			left := m[j/ft.K*ts+int(ft.Indices[j])]
			switch {
			case v == MaxValue || v == -MaxValue:
				clamped++
				if !(left*v > 0) {
					t.Fatalf("tensor %d: a value sent as %v left %v behind", i, v, left)
				}
			case math.Abs(float64(v)) < MaxValue:
				whole++
				if math.Float32bits(left) != 0 {
					t.Fatalf("tensor %d: a value sent whole (%v) left %v behind", i, v, left)
				}
			default:
				t.Fatalf("tensor %d: sent %v", i, v)
			}
		}
	}
	if clamped == 0 || whole == 0 {
		t.Fatalf("%d values clamped, %d sent whole: want both", clamped, whole)
	}
}

// TestFrameOfRefusesValuesBeyondTheBound: an engine that computes its
// frame elsewhere must clamp as Step does; FrameOf refuses one that did not.
func TestFrameOfRefusesValuesBeyondTheBound(t *testing.T) {
	p, err := NewPlan([][]int{{8}}, Options{Chunk: 8, TopK: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		v  float32
		ok bool
	}{{MaxValue, true}, {-MaxValue, true}, {math.Nextafter32(MaxValue, 2*MaxValue), false}, {-1e30, false}} {
		_, err := p.FrameOf([][]uint32{{3, 1}}, [][]float32{{tc.v, 1}})
		if tc.ok != (err == nil) {
			t.Errorf("a value of %v: %v", tc.v, err)
		}
	}
}

// boundedRound is a round of frames at the bound's worst: n frames whose k
// values per tile are all +MaxValue on the same indices (the mean's float32
// sums reach n·2^40), then frames that together send every coefficient of
// every tile at +MaxValue: every basis function is positive at a tile's
// first element, so the inverse DCT there sums all of them (the largest
// output a tile of bounded coefficients has, up to the orthonormal √ts·2^40).
func boundedRound(t *testing.T, p *Plan, n int) []*Frame {
	t.Helper()
	var frames []*Frame
	layouts := p.Layouts()
	maxCover := 1
	for _, l := range layouts {
		maxCover = max(maxCover, l.TileH*l.TileW/l.K)
	}
	for f := range n + maxCover {
		idx, vals := make([][]uint32, len(layouts)), make([][]float32, len(layouts))
		for i, l := range layouts {
			ts := l.TileH * l.TileW
			start := 0 // the first n frames all send the first k indices
			if f >= n {
				start = (f - n) * l.K % ts
			}
			for range l.Tiles() {
				for j := range l.K {
					idx[i] = append(idx[i], uint32((start+j)%ts))
					vals[i] = append(vals[i], MaxValue)
				}
			}
		}
		fr, err := p.FrameOf(idx, vals)
		if err != nil {
			t.Fatal(err)
		}
		b, err := fr.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if fr, err = DecodeFrame(b, p.Limits()); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, fr)
	}
	return frames
}

// TestBoundedFramesStayFinite: frames at ±MaxValue — 256 on the same
// indices (a round's most) and enough more to fill whole tiles of up to
// 2^15 coefficients — through Combine, the inverse DCT and every update
// rule, under every aggregation rule: every combined value is within
// ±MaxValue and every parameter stays finite (MaxValue's comment shows the
// arithmetic).
func TestBoundedFramesStayFinite(t *testing.T) {
	shapes := [][]int{{64, 64}, {1 << 15}, {3, 7, 5}}
	for _, agg := range []Aggregation{AggregateRobust, AggregateMean, AggregateClippedMean} {
		for _, up := range []UpdateRule{UpdateSign, UpdateRMS, UpdateRMSClip, UpdateAdam} {
			name := fmt.Sprintf("%s/%s", agg, up)
			o := Options{Chunk: 1 << 15, TopK: 1024, Decay: 0.9, WeightDecay: 0.1, Aggregation: agg, Update: up, Workers: 2}
			d, err := NewDeMo(shapes, o)
			if err != nil {
				t.Fatal(err)
			}
			frames := boundedRound(t, d.Plan(), 256)
			if up == UpdateSign {
				c, err := d.Plan().Combine(frames)
				if err != nil {
					t.Fatal(err)
				}
				for i, ct := range c.Tensors {
					for j, v := range ct.Values {
						if !(v >= -MaxValue && v <= MaxValue) {
							t.Fatalf("%s: tensor %d: combined value %d is %v", name, i, j, v)
						}
					}
				}
			}
			if up == UpdateAdam { // its direction is the inverse DCT itself
				out := randomTensors(rand.New(rand.NewPCG(0, 0)), shapes, 0)
				if err := d.Plan().Aggregate(out, frames); err != nil {
					t.Fatal(err)
				}
				for i, l := range d.Plan().Layouts() {
					limit := math.Sqrt(float64(l.TileH*l.TileW)) * MaxValue * (1 + 1e-3)
					for j, v := range out[i] {
						if !(math.Abs(float64(v)) <= limit) {
							t.Fatalf("%s: tensor %d [%d] decodes to %v, beyond √ts·MaxValue", name, i, j, v)
						}
					}
				}
			}
			params := randomTensors(rand.New(rand.NewPCG(1, 2)), shapes, 1)
			for range 2 { // Adam's moments see a second round
				if err := d.Apply(params, frames, 0.01); err != nil {
					t.Fatal(err)
				}
			}
			for i, p := range params {
				for j, v := range p {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						t.Fatalf("%s: tensor %d [%d] is %v", name, i, j, v)
					}
				}
			}
		}
	}
}
