package torch

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// hostile is f as a float frame with every value replaced by ±v against
// its own sign, as a poisoner would send it. The encoder refuses values beyond
// distro.MaxValue, so the frame is encoded with marker values whose bytes
// are then overwritten.
func hostile(t *testing.T, f *distro.Frame, v float32) []byte {
	t.Helper()
	const marker = float32(1.2345678e-7)
	g := &distro.Frame{Tensors: make([]distro.Tensor, len(f.Tensors))}
	n := 0
	for i, ft := range f.Tensors {
		gt := ft
		gt.Quantized = false
		gt.Values = make([]float32, len(ft.Values))
		for j, x := range ft.Values {
			gt.Values[j] = float32(math.Copysign(float64(marker), -float64(x)))
		}
		g.Tensors[i] = gt
		n += len(gt.Values)
	}
	b, err := g.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	le := func(x float32) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(x)) }
	if c := bytes.Count(b, le(marker)) + bytes.Count(b, le(-marker)); c != n {
		t.Fatalf("the marker's bytes occur %d times in a frame of %d values", c, n)
	}
	b = bytes.ReplaceAll(b, le(marker), le(v))
	return bytes.ReplaceAll(b, le(-marker), le(-v))
}

// received is what a trainer keeps of a round's payloads: those that decode
// within the run's limits and fit its model (trainer/node leaves the
// others out and reports their senders).
func received(plan *distro.Plan, payloads [][]byte) (kept []*distro.Frame, refused int) {
	for _, b := range payloads {
		f, err := distro.DecodeFrame(b, plan.Limits())
		if err == nil {
			err = plan.Check(f)
		}
		if err != nil {
			refused++
			continue
		}
		kept = append(kept, f)
	}
	return kept, refused
}

// decodedF64 is the round's aggregate after the inverse DCT, per
// parameter, in float64 from Combine's coefficients, with the sum of its
// terms' magnitudes: a float32 inverse DCT errs by a small multiple of ε
// times that sum, so where the value is within that of zero its sign is
// rounding's, and either engine may take either.
func decodedF64(plan *distro.Plan, c *distro.Combined) (value, scale [][]float64) {
	for ti, l := range plan.Layouts() {
		bh, bw := basis(l.TileH), basis(l.TileW)
		val := make([]float64, l.Outer*l.Rows*l.Cols)
		sc := make([]float64, len(val))
		ct := c.Tensors[ti]
		tilesC := l.Cols / l.TileW
		for e := 0; e < len(ct.Values); {
			tile := int(ct.Tiles[e])
			coef := map[int]float64{}
			for ; e < len(ct.Values) && int(ct.Tiles[e]) == tile; e++ {
				coef[int(ct.Index[e])] = float64(ct.Values[e])
			}
			o, tr, tc := tile/(l.Rows/l.TileH*tilesC), tile/tilesC%(l.Rows/l.TileH), tile%tilesC
			for r := range l.TileH {
				for col := range l.TileW {
					var s, a float64
					for ix, v := range coef {
						term := v * bh[ix/l.TileW][r] * bw[ix%l.TileW][col]
						s += term
						a += math.Abs(term)
					}
					at := (o*l.Rows+tr*l.TileH+r)*l.Cols + tc*l.TileW + col
					val[at], sc[at] = s, a
				}
			}
		}
		value, scale = append(value, val), append(scale, sc)
	}
	return value, scale
}

// nearZero is how close to zero, relative to the sum of its terms'
// magnitudes, a decoded value must be for its sign to be rounding's: well
// above what either engine's float32 inverse DCT errs by on these 16×16
// tiles (a few ε per stage), far below any value the DCT means.
const nearZero = 1.0 / (1 << 16)

// TestHostileFramesKeepEnginesEqual: a round with one or two hostile float
// frames — every value at float32's maximum, or at distro.MaxValue, against
// its own sign — received as a trainer receives it (what does not decode
// within the run's limits is left out) and applied by a Go and a torch
// trainer on the same weights, under every aggregation rule. Both trainers
// must hold finite weights, equal bit for bit except where the decoded
// aggregate is within rounding of zero (its sign is then rounding's: such a
// parameter moves by 2·lr on one engine against the other, as in
// TestApplyParity). Before frames' values were bounded, one frame at
// float32's maximum made the inverse DCT overflow to NaN, whose sign Go
// takes as ±1 and torch as 0: here, under the mean, 79 of the 62,400
// parameters differed where the aggregate is far from zero (two frames,
// whose sum is Inf: 3,151). Frames at the bound are accepted, and their
// arithmetic stays finite on both engines.
func TestHostileFramesKeepEnginesEqual(t *testing.T) {
	ctx := context.Background()
	goOp, torchOp := openers(t)
	pm := parityModels[0]
	for _, quantize := range []bool{false, true} {
		o := runOptions(quantize)
		fs := frames(t, pm.cfg, o, 6)
		honest := make([][]byte, 4)
		for i, f := range fs[:4] {
			b, err := f.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			honest[i] = b
		}
		g := open(t, goOp, pm.cfg, 3, o)
		tt := open(t, torchOp, pm.cfg, 3, o)
		// Hostile float frames: in a 1-bit run the 1-bit base frames'
		// values become floats, which the run refuses anyway.
		for _, agg := range []distro.Aggregation{distro.AggregateRobust, distro.AggregateMean, distro.AggregateClippedMean} {
			for _, tc := range []struct {
				name  string
				value float32
				bad   int
			}{
				{"one at float32's maximum", math.MaxFloat32, 1},
				{"two at float32's maximum", math.MaxFloat32, 2},
				{"one at the bound", distro.MaxValue, 1},
				{"two at the bound", distro.MaxValue, 2},
			} {
				name := fmt.Sprintf("1-bit=%v/%s/%s", quantize, agg, tc.name)
				payloads := honest
				for _, f := range fs[4 : 4+tc.bad] {
					payloads = append(payloads[:len(payloads):len(payloads)], hostile(t, f, tc.value))
				}
				ao := o
				ao.Aggregation = agg
				plan := planOf(t, g, ao)
				round, refused := received(plan, payloads)
				c := combine(t, plan, round)
				// Both start the round from the torch trainer's weights.
				tm, err := hostModel(ctx, tt)
				if err != nil {
					t.Fatal(err)
				}
				gm, _ := hostModel(ctx, g)
				for i, w := range gm.Tensors() {
					copy(w, tm.Tensors()[i])
				}
				const lr = 0.01
				for _, e := range []engine.Engine{g, tt} {
					if err := e.Apply(ctx, c, lr); err != nil {
						t.Fatalf("%s: %s: %v", name, e.Name(), err)
					}
				}
				if tm, err = hostModel(ctx, tt); err != nil {
					t.Fatal(err)
				}
				value, scale := decodedF64(plan, c)
				total, flipped, worst := 0, 0, 0.0
				for i, want := range gm.Tensors() {
					got := tm.Tensors()[i]
					for j := range want {
						total++
						if math.IsNaN(float64(got[j])) || math.IsInf(float64(got[j]), 0) || math.IsNaN(float64(want[j])) || math.IsInf(float64(want[j]), 0) {
							t.Fatalf("%s: tensor %d [%d]: torch %v, go %v", name, i, j, got[j], want[j])
						}
						if math.Float32bits(got[j]) == math.Float32bits(want[j]) {
							continue
						}
						flipped++
						rel := math.Abs(value[i][j]) / scale[i][j]
						worst = max(worst, rel)
						if !(rel <= nearZero) {
							t.Errorf("%s: tensor %d [%d]: torch %v, go %v, where the aggregate decodes to %.6g (%.2g of its terms' magnitudes: not rounding)",
								name, i, j, got[j], want[j], value[i][j], rel)
						}
					}
				}
				t.Logf("%s: %d of %d results refused; %d of %d parameters differ, each within %.2g of zero relative to its terms",
					name, refused, len(payloads), flipped, total, worst)
				if refused < tc.bad && tc.value > distro.MaxValue {
					t.Errorf("%s: a frame with values beyond distro.MaxValue was accepted", name)
				}
			}
		}
	}
}

// TestStepClampsAsGo: with neither normalization nor a clip, nothing but
// the clamp bounds a frame's values; on a gradient scaled by 1e20 at lr 1
// the torch engine sends ±distro.MaxValue wherever the Go engine does, and
// keeps the excess in its residual as Go does: given a zero gradient next,
// both send the same indices again, clamped again (a residual zeroed as a
// 1-bit run's would send other indices). Every frame decodes.
func TestStepClampsAsGo(t *testing.T) {
	ctx := context.Background()
	goOp, torchOp := openers(t)
	pm := parityModels[0]
	o := runOptions(false)
	o.ClipGradNorm = 0
	g := open(t, goOp, pm.cfg, 3, o)
	tt := open(t, torchOp, pm.cfg, 3, o)
	if _, err := g.Gradient(ctx, randomBatch(rand.New(rand.NewPCG(5, 6)), vocabOf(pm.cfg), 2, pm.cfg.Context())); err != nil {
		t.Fatal(err)
	}
	gm, _ := hostModel(ctx, g)
	for step, scale := range []float32{1e20, 0} {
		for _, gr := range gm.GradTensors() {
			for j := range gr {
				gr[j] *= scale
			}
		}
		if err := tt.(*eng).SetGradients(ctx, gm.GradTensors()); err != nil {
			t.Fatal(err)
		}
		gf, err := g.Step(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		tf, err := tt.Step(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		entries, same, clamped := 0, 0, 0
		for i := range gf.Tensors {
			gt, ttn := &gf.Tensors[i], &tf.Tensors[i]
			for j, v := range gt.Values {
				entries++
				if ttn.Indices[j] != gt.Indices[j] {
					continue
				}
				same++
				tv := ttn.Values[j]
				if math.Abs(float64(v)) == distro.MaxValue || math.Abs(float64(tv)) == distro.MaxValue {
					clamped++
					if tv != v {
						t.Fatalf("step %d: tensor %d entry %d: torch sends %v, go %v", step, i, j, tv, v)
					}
				} else if relErr(float64(tv), float64(v)) > 1e-4 {
					t.Fatalf("step %d: tensor %d entry %d: torch sends %v, go %v", step, i, j, tv, v)
				}
			}
		}
		for _, f := range []*distro.Frame{gf, tf} {
			b, err := f.MarshalBinary()
			if err == nil {
				_, err = distro.DecodeFrame(b, planOf(t, g, o).Limits())
			}
			if err != nil {
				t.Fatalf("step %d: an honest frame is refused: %v", step, err)
			}
		}
		t.Logf("step %d: %d of %d entries at the same index, %d of them clamped", step, same, entries, clamped)
		if same*10 < entries*9 || clamped*2 < same {
			t.Errorf("step %d: %d of %d entries at the same index, %d clamped: want most of both", step, same, entries, clamped)
		}
	}
}

// TestWorkerRefusesValuesBeyondTheBound: the worker refuses a round whose
// combined values are beyond the bound psyche sent it (distro.MaxValue), or
// not numbers, before any parameter moves (a bad value in the last tensor,
// an ordinary one in the first); values at the bound apply.
func TestWorkerRefusesValuesBeyondTheBound(t *testing.T) {
	ctx := context.Background()
	_, torchOp := openers(t)
	pm := parityModels[0]
	e := open(t, torchOp, pm.cfg, 3, runOptions(false)).(*eng)
	m, err := hostModel(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	rev := runmodel.Revision(m)
	n := len(e.shapes)
	for _, tc := range []struct {
		v  float32
		ok bool
	}{
		{distro.MaxValue, true},
		{-distro.MaxValue, true},
		{math.Nextafter32(distro.MaxValue, math.MaxFloat32), false},
		{-math.MaxFloat32, false},
		{float32(math.Inf(1)), false},
		{float32(math.NaN()), false},
	} {
		var blobs [][]byte
		for i := range n {
			v := float32(0.5)
			if i == n-1 {
				v = tc.v
			}
			blobs = append(blobs, u32Bytes([]uint32{0}), u32Bytes([]uint32{0}), f32Bytes([]float32{v}))
		}
		e.mu.Lock()
		_, err := e.do(ctx, e.timeout, &lrRequest{op: op{Op: opApply}, LR: 0.01}, blobs)
		e.mu.Unlock()
		if m, err2 := hostModel(ctx, e); err2 != nil {
			t.Fatal(err2)
		} else if moved := runmodel.Revision(m) != rev; tc.ok != (err == nil) || moved != tc.ok {
			t.Fatalf("a combined value of %v: %v (the model moved: %v)", tc.v, err, moved)
		} else {
			rev = runmodel.Revision(m)
		}
		if err != nil && !strings.Contains(err.Error(), "distro.MaxValue") {
			t.Errorf("a combined value of %v: %v, want the bound named", tc.v, err)
		}
	}
}
