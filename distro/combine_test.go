package distro

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// applyCombined checks what Combine promises of its output (no zero or NaN
// value, each (tile, index) once and in order: ApplyCombined checks the
// rest) and applies it as every engine does.
func applyCombined(t *testing.T, p *Plan, params [][]float32, c *Combined, lr float32) {
	t.Helper()
	for i := range c.Tensors {
		for j, v := range c.Tensors[i].Values {
			if v == 0 || math.IsNaN(float64(v)) {
				t.Fatalf("tensor %d: entry %d: value %v", i, j, v)
			}
		}
	}
	if err := p.ApplyCombined(params, c, lr); err != nil {
		t.Fatal(err)
	}
}

func cloneTensors(ts [][]float32) [][]float32 {
	out := make([][]float32, len(ts))
	for i, t := range ts {
		out[i] = slices.Clone(t)
	}
	return out
}

func entries(frames []*Frame) int {
	n := 0
	for _, f := range frames {
		for _, t := range f.Tensors {
			n += len(t.Values)
		}
	}
	return n
}

// TestCombineThenSignIsApply scatters Combine's output into zero tiles,
// inverts, takes the sign and updates the parameters, and wants Apply's
// parameters bit for bit: under every rule, with 1-bit and float values,
// one to seven peers, dissenters, duplicated frames and poisoned values.
func TestCombineThenSignIsApply(t *testing.T) {
	shapeSets := []struct {
		name   string
		shapes [][]int
	}{
		{"1-D", [][]int{{37}, {50}, {7}}},
		{"2-D", [][]int{{64, 64}, {96, 40}, {67, 10}, {128, 96}}},
		{"3-D", [][]int{{2, 3, 16}, {2, 3, 16, 24}, {4, 1, 5}}},
	}
	flip := func(f *Frame) *Frame {
		g := cloneFrame(f)
		for i := range g.Tensors {
			for j, v := range g.Tensors[i].Values {
				g.Tensors[i].Values[j] = -v
			}
		}
		return g
	}
	rounds := []struct {
		name  string
		peers int
		make  func(fs []*Frame) []*Frame
	}{
		{"no frames", 0, func(fs []*Frame) []*Frame { return nil }},
		{"one peer", 1, func(fs []*Frame) []*Frame { return fs }},
		{"three peers", 3, func(fs []*Frame) []*Frame { return fs }},
		{"seven peers", 7, func(fs []*Frame) []*Frame { return fs }},
		{"two dissenters of seven", 7, func(fs []*Frame) []*Frame { return append([]*Frame{flip(fs[0]), flip(fs[1])}, fs[2:]...) }},
		{"three dissenters of seven", 7, func(fs []*Frame) []*Frame {
			return append([]*Frame{flip(fs[0]), flip(fs[1]), flip(fs[2])}, fs[3:]...)
		}},
		{"duplicated frames", 4, func(fs []*Frame) []*Frame { return append(fs, fs[0], cloneFrame(fs[0]), fs[2]) }},
		{"poisoned", 5, func(fs []*Frame) []*Frame {
			g := cloneFrame(fs[0])
			for i := range g.Tensors {
				for j, v := range g.Tensors[i].Values {
					if !g.Tensors[i].Quantized {
						g.Tensors[i].Values[j] = float32(math.Copysign(1e30, -float64(v)))
					}
				}
			}
			return append(fs[1:], g)
		}},
	}
	for _, ss := range shapeSets {
		for _, agg := range []Aggregation{AggregateRobust, AggregateMean, AggregateClippedMean} {
			for _, q := range []bool{false, true} {
				for _, tiling := range []struct{ chunk, topk int }{{16, 8}, {64, 4}} {
					o := Options{Chunk: tiling.chunk, TopK: tiling.topk, Quantize1Bit: q, Decay: 0.9, WeightDecay: 0.1, Aggregation: agg, Workers: 3}
					for ri, rd := range rounds {
						name := fmt.Sprintf("%s/%s/1bit=%v/chunk=%d/%s", ss.name, agg, q, tiling.chunk, rd.name)
						var frames []*Frame
						if rd.peers > 0 {
							frames = rd.make(roundFrames(t, uint64(ri+1), ss.shapes, o, rd.peers))
						}
						d, err := NewDeMo(ss.shapes, o)
						if err != nil {
							t.Fatal(err)
						}
						params := randomTensors(rand.New(rand.NewPCG(uint64(ri), 3)), ss.shapes, 1)
						want, got := cloneTensors(params), cloneTensors(params)
						const lr = 0.01
						if err := d.Apply(want, frames, lr); err != nil {
							t.Fatalf("%s: Apply: %v", name, err)
						}
						c, err := d.Plan().Combine(frames)
						if err != nil {
							t.Fatalf("%s: Combine: %v", name, err)
						}
						if n, max := c.size(), entries(frames); n > max {
							t.Errorf("%s: %d combined entries from frames of %d", name, n, max)
						}
						applyCombined(t, d.Plan(), got, c, lr)
						for i := range want {
							for j := range want[i] {
								if math.Float32bits(want[i][j]) != math.Float32bits(got[i][j]) {
									t.Fatalf("%s: tensor %d [%d]: Apply %v, Combine %v", name, i, j, want[i][j], got[i][j])
								}
							}
						}
						// The output does not depend on the number of workers.
						o1 := o
						o1.Workers = 1
						p1, _ := NewPlan(ss.shapes, o1)
						if c1, err := p1.Combine(frames); err != nil || !reflect.DeepEqual(c1, c) {
							t.Fatalf("%s: Combine with one worker differs (%v)", name, err)
						}
					}
				}
			}
		}
	}
}

func (c *Combined) size() int {
	n := 0
	for i := range c.Tensors {
		n += c.Tensors[i].Entries()
	}
	return n
}

func TestCombineRefusesOtherUpdateRules(t *testing.T) {
	shapes := [][]int{{16, 16}}
	o := Options{Chunk: 8, TopK: 2, Decay: 0.9}
	frames := roundFrames(t, 1, shapes, o, 2)
	for _, u := range []UpdateRule{UpdateRMS, UpdateRMSClip, UpdateAdam} {
		o.Update = u
		p, err := NewPlan(shapes, o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Combine(frames); err == nil {
			t.Errorf("Combine under update rule %s: no error", u)
		}
	}
	o.Update = UpdateSign
	p, _ := NewPlan(shapes, o)
	if _, err := p.Combine(frames); err != nil {
		t.Errorf("Combine under sign: %v", err)
	}
	bad := cloneFrame(frames[0])
	bad.Tensors[0].K = 3
	if _, err := p.Combine([]*Frame{frames[1], bad}); !errors.Is(err, ErrMismatch) {
		t.Errorf("Combine of a frame that does not fit: %v, want ErrMismatch", err)
	}
}

// TestFrameOfRoundTripsStep rebuilds Step's frames from their indices and
// values, in Step's order and shuffled within tiles, and checks what
// FrameOf refuses.
func TestFrameOfRoundTripsStep(t *testing.T) {
	shapes := [][]int{{64, 64}, {96, 40}, {67, 10}, {37}, {2, 3, 16}, {1}}
	r := rand.New(rand.NewPCG(8, 9))
	for _, q := range []bool{false, true} {
		for _, rice := range []bool{false, true} {
			o := Options{Chunk: 16, TopK: 8, Quantize1Bit: q, RiceIndices: rice, Decay: 0.9}
			d, err := NewDeMo(shapes, o)
			if err != nil {
				t.Fatal(err)
			}
			for step := range 3 {
				f, err := d.Step(randomTensors(r, shapes, 1), 0.1)
				if err != nil {
					t.Fatal(err)
				}
				var idx [][]uint32
				var vals [][]float32
				for _, ft := range f.Tensors {
					idx, vals = append(idx, ft.Indices), append(vals, ft.Values)
				}
				g, err := d.FrameOf(idx, vals)
				if err != nil || !reflect.DeepEqual(g, f) {
					t.Fatalf("1-bit %v rice %v step %d: FrameOf differs from Step's frame (%v)", q, rice, step, err)
				}
				if &g.Tensors[0].Indices[0] == &f.Tensors[0].Indices[0] {
					t.Fatal("FrameOf keeps the caller's slices")
				}
				// Shuffled within each tile.
				for i, ft := range f.Tensors {
					idx[i], vals[i] = slices.Clone(ft.Indices), slices.Clone(ft.Values)
					for start := 0; start < len(idx[i]); start += ft.K {
						r.Shuffle(ft.K, func(a, b int) {
							idx[i][start+a], idx[i][start+b] = idx[i][start+b], idx[i][start+a]
							vals[i][start+a], vals[i][start+b] = vals[i][start+b], vals[i][start+a]
						})
					}
				}
				snapshot := slices.Clone(idx[0])
				if g, err = d.FrameOf(idx, vals); err != nil || !reflect.DeepEqual(g, f) {
					t.Fatalf("1-bit %v step %d: FrameOf of shuffled tiles differs from Step's frame (%v)", q, step, err)
				}
				if !slices.Equal(idx[0], snapshot) {
					t.Fatal("FrameOf changed the caller's indices")
				}
				if _, err := g.MarshalBinary(); err != nil {
					t.Fatal(err)
				}
			}

			// What FrameOf refuses.
			f, _ := d.Step(randomTensors(r, shapes, 1), 0.1)
			base := func() ([][]uint32, [][]float32) {
				var idx [][]uint32
				var vals [][]float32
				for _, ft := range f.Tensors {
					idx, vals = append(idx, slices.Clone(ft.Indices)), append(vals, slices.Clone(ft.Values))
				}
				return idx, vals
			}
			for _, bad := range []struct {
				name      string
				spoil     func(idx [][]uint32, vals [][]float32) ([][]uint32, [][]float32)
				nonFinite bool
			}{
				{"a tensor missing", func(idx [][]uint32, vals [][]float32) ([][]uint32, [][]float32) { return idx[1:], vals[1:] }, false},
				{"an entry missing", func(idx [][]uint32, vals [][]float32) ([][]uint32, [][]float32) {
					idx[1], vals[1] = idx[1][1:], vals[1][1:]
					return idx, vals
				}, false},
				{"values and indices of different lengths", func(idx [][]uint32, vals [][]float32) ([][]uint32, [][]float32) {
					vals[0] = vals[0][1:]
					return idx, vals
				}, false},
				{"an index outside its tile", func(idx [][]uint32, vals [][]float32) ([][]uint32, [][]float32) {
					idx[0][8] = 16 * 16
					return idx, vals
				}, false},
				{"an index twice in a tile", func(idx [][]uint32, vals [][]float32) ([][]uint32, [][]float32) {
					idx[0][9] = idx[0][10]
					return idx, vals
				}, false},
				{"NaN", func(idx [][]uint32, vals [][]float32) ([][]uint32, [][]float32) {
					vals[2][3] = float32(math.NaN())
					return idx, vals
				}, true},
				{"Inf", func(idx [][]uint32, vals [][]float32) ([][]uint32, [][]float32) {
					vals[3][0] = float32(math.Inf(-1))
					return idx, vals
				}, true},
			} {
				idx, vals := bad.spoil(base())
				_, err := d.FrameOf(idx, vals)
				if err == nil || errors.Is(err, ErrNonFinite) != bad.nonFinite {
					t.Errorf("1-bit %v: FrameOf with %s: %v", q, bad.name, err)
				}
			}
			if q {
				idx, vals := base()
				vals[0][0] = 0.5
				if _, err := d.FrameOf(idx, vals); err == nil {
					t.Error("FrameOf of a 1-bit run with a value 0.5: no error")
				}
			}
		}
	}
}

// TestLayouts checks the layouts against the tiles Step and Apply cut.
func TestLayouts(t *testing.T) {
	shapes := [][]int{{64, 64}, {96, 40}, {67, 10}, {37}, {2, 3, 16, 24}, {1}}
	p, err := NewPlan(shapes, Options{Chunk: 16, TopK: 8})
	if err != nil {
		t.Fatal(err)
	}
	lay := p.Layouts()
	if len(lay) != len(shapes) {
		t.Fatalf("%d layouts for %d tensors", len(lay), len(shapes))
	}
	for i, l := range lay {
		tp := p.plans[i]
		if !slices.Equal(l.Shape, shapes[i]) || l.Outer*l.Rows*l.Cols != tp.params || l.Rows%l.TileH != 0 || l.Cols%l.TileW != 0 || l.K != tp.k {
			t.Fatalf("tensor %d: layout %+v", i, l)
		}
		if l.Tiles() != tp.tiles() {
			t.Fatalf("tensor %d: %d tiles, the plan has %d", i, l.Tiles(), tp.tiles())
		}
		tilesR, tilesC := l.Rows/l.TileH, l.Cols/l.TileW
		for o := range l.Outer {
			for tr := range tilesR {
				for tc := range tilesC {
					tile := (o*tilesR+tr)*tilesC + tc
					if want := (o*l.Rows+tr*l.TileH)*l.Cols + tc*l.TileW; tp.origin(tile) != want {
						t.Fatalf("tensor %d tile %d: origin %d, layout says %d", i, tile, tp.origin(tile), want)
					}
				}
			}
		}
	}
	if _, err := NewPlan(shapes, Options{Chunk: 16, TopK: 8, Decay: 1}); err == nil {
		t.Error("NewPlan accepted decay 1")
	}
}

// TestKeep pins the weight-decay factor's rounding: 1 − lr·wd with the
// product rounded to float32 first.
func TestKeep(t *testing.T) {
	p, _ := NewPlan([][]int{{4}}, Options{Chunk: 4, TopK: 1, WeightDecay: 0.1})
	for _, lr := range []float32{0, 1e-3, 3e-4, 0.01, 6e-4, 1} {
		prod := float32(float64(lr) * float64(float32(0.1))) // exact in float64, rounded once
		if want := float32(float64(1) - float64(prod)); p.Keep(lr) != want {
			t.Errorf("Keep(%v) = %v, want %v", lr, p.Keep(lr), want)
		}
	}
}

// TestApplyCombinedRefuses wants every aggregate that does not fit the plan
// refused, and the parameters untouched.
func TestApplyCombinedRefuses(t *testing.T) {
	shapes := [][]int{{16, 16}, {8}}
	p, err := NewPlan(shapes, Options{Chunk: 8, TopK: 2})
	if err != nil {
		t.Fatal(err)
	}
	good := func() *Combined {
		return &Combined{Tensors: []CombinedTensor{
			{Tiles: []uint32{0, 0, 3}, Index: []uint32{1, 5, 63}, Values: []float32{1, -2, 3}},
			{Tiles: []uint32{0}, Index: []uint32{7}, Values: []float32{1}},
		}}
	}
	cases := []struct {
		name  string
		spoil func(c *Combined) *Combined
	}{
		{"nil", func(*Combined) *Combined { return nil }},
		{"a tensor short", func(c *Combined) *Combined { c.Tensors = c.Tensors[:1]; return c }},
		{"lengths differ", func(c *Combined) *Combined { c.Tensors[0].Index = c.Tensors[0].Index[:2]; return c }},
		{"tile outside", func(c *Combined) *Combined { c.Tensors[0].Tiles[2] = 4; return c }},
		{"index outside", func(c *Combined) *Combined { c.Tensors[1].Index[0] = 8; return c }},
		{"out of order", func(c *Combined) *Combined { c.Tensors[0].Index[1] = 0; return c }},
		{"repeated", func(c *Combined) *Combined { c.Tensors[0].Index[1] = 1; return c }},
	}
	params := randomTensors(rand.New(rand.NewPCG(1, 2)), shapes, 1)
	if err := p.ApplyCombined(cloneTensors(params), good(), 0.1); err != nil {
		t.Fatalf("the good aggregate: %v", err)
	}
	for _, tc := range cases {
		got := cloneTensors(params)
		if err := p.ApplyCombined(got, tc.spoil(good()), 0.1); err == nil {
			t.Errorf("%s: applied", tc.name)
		}
		if !reflect.DeepEqual(got, params) {
			t.Errorf("%s: the parameters changed", tc.name)
		}
	}
	if err := p.ApplyCombined(params[:1], good(), 0.1); err == nil {
		t.Error("applied to one tensor of two")
	}
}
