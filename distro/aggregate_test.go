package distro

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// entry is one coefficient a peer sends: index and value.
type entry struct {
	ix uint32
	v  float32
}

// tinyFrame is a frame of one 1-D tensor of 8 values (one tile, k entries).
func tinyFrame(es ...entry) *Frame {
	t := Tensor{Shape: []int{8}, TileH: 1, TileW: 8, K: len(es)}
	for _, e := range es {
		t.Indices = append(t.Indices, e.ix)
		t.Values = append(t.Values, e.v)
	}
	return &Frame{Tensors: []Tensor{t}}
}

// combined returns the dense coefficients (before the inverse DCT) that a
// rule makes of the frames' one tile.
func combined(rule Aggregation, quantized bool, frames []*Frame) []float32 {
	k := frames[0].Tensors[0].K
	c := newCombiner(Options{Aggregation: rule, Quantize1Bit: quantized}, 8, k, len(frames))
	tile := make([]float32, 8)
	c.tile(tile, canonicalOrder(frames), 0, 0)
	return tile
}

// TestAggregationRules pins what each rule makes of a coefficient, on
// frames small enough to work out by hand.
func TestAggregationRules(t *testing.T) {
	one := func(ix uint32, vs ...float32) []*Frame { // one peer per value, all on index ix
		var fs []*Frame
		for _, v := range vs {
			fs = append(fs, tinyFrame(entry{ix, v}))
		}
		return fs
	}
	type want map[uint32]float32 // every other index must be 0
	for _, tc := range []struct {
		name      string
		rule      Aggregation
		quantized bool
		frames    []*Frame
		want      want
	}{
		// Psyche's mean: every index is the average of its senders.
		{"mean/duplicates averaged", AggregateMean, false, one(1, 3, 1), want{1: 2}},
		{"mean/a poisoner with 1e30 decides", AggregateMean, false, one(1, 1, 1.1, 0.9, 1, 1e30), want{1: 2e29}},
		{"mean/a lone sender counts fully", AggregateMean, false,
			[]*Frame{tinyFrame(entry{1, 2}), tinyFrame(entry{2, 2}), tinyFrame(entry{2, 2})}, want{1: 2, 2: 2}},
		{"mean/a flipped sign drags", AggregateMean, false, one(1, 1, 1, 1, 1, -1), want{1: 0.6}},

		// Median-norm clipping (lower median), then the mean.
		{"clipped-mean/1e30 clipped to the median", AggregateClippedMean, false, one(1, 1, 1, 1e30), want{1: 1}},
		{"clipped-mean/two peers: the larger clipped to the smaller", AggregateClippedMean, false, one(1, 1, 3), want{1: 1}},
		{"clipped-mean/a lone sender counts fully", AggregateClippedMean, false,
			[]*Frame{tinyFrame(entry{1, 2}), tinyFrame(entry{2, 2}), tinyFrame(entry{2, 2})}, want{1: 2, 2: 2}},
		{"clipped-mean/norms are per tile, over all k values", AggregateClippedMean, false,
			[]*Frame{tinyFrame(entry{0, 3}, entry{1, 4}), tinyFrame(entry{0, 3}, entry{1, 4}), tinyFrame(entry{0, 30}, entry{1, 40})},
			want{0: 3, 1: 4}},

		// Robust, float values: clip, trimmed mean, lone senders weighed 1/q.
		{"robust/one peer alone", AggregateRobust, false, one(1, 5), want{1: 5}}, // q = 1: one peer's result applies unchanged
		{"robust/median of three", AggregateRobust, false, one(1, 1, 2, 3), want{1: 2}},
		{"robust/a poisoner with 1e30 is clipped and trimmed", AggregateRobust, false, one(1, 1, 1.1, 0.9, 1, 1e30), want{1: 1}},
		// Clipped to the median norm 1: {1, 1, 0.75, 1, −1}; trimmed: {0.75, 1, 1}.
		{"robust/a poisoner with -1e30 is clipped and trimmed", AggregateRobust, false, one(1, 1, 1.25, 0.75, 1, -1e30), want{1: 2.75 / 3}},
		{"robust/a flipped sign is trimmed", AggregateRobust, false, one(1, 1, 1, 1, 1, -1), want{1: 1}},
		// Clipped to the median norm 2: {−2, 1, 1, 2, 2, 2, 2, 2}; two
		// trimmed from each end: {1, 2, 2, 2}.
		{"robust/eight senders: two trimmed from each end", AggregateRobust, false, one(1, -5, 1, 1, 2, 2, 3, 3, 9), want{1: 1.75}},
		{"robust/a lone sender of three peers counts 1/3", AggregateRobust, false,
			[]*Frame{tinyFrame(entry{1, 3}), tinyFrame(entry{2, 3}), tinyFrame(entry{2, 3})}, want{1: 1, 2: 2}},
		{"robust/a lone sender of two peers counts 1/2", AggregateRobust, false,
			[]*Frame{tinyFrame(entry{1, 3}), tinyFrame(entry{2, 3})}, want{1: 1.5, 2: 1.5}},
		{"robust/a lone poisoner is clipped, then counts 1/3", AggregateRobust, false,
			[]*Frame{tinyFrame(entry{1, 1e30}), tinyFrame(entry{2, 3}), tinyFrame(entry{2, 3}), tinyFrame(entry{2, 3})},
			want{1: 1, 2: 3}},

		// Robust, 1-bit runs: a majority vote clamped at ±q, over q.
		{"vote/unanimous", AggregateRobust, true, one(1, 1, 1, 1, 1), want{1: 1}},
		{"vote/a tie is no step", AggregateRobust, true, one(1, 1, 1, -1, -1), want{}},
		{"vote/three to one", AggregateRobust, true, one(1, 1, 1, 1, -1), want{1: 2.0 / 3}},
		{"vote/a lone sender of three peers counts 1/3", AggregateRobust, true,
			[]*Frame{tinyFrame(entry{1, -1}), tinyFrame(entry{2, 1}), tinyFrame(entry{2, 1})}, want{1: -1.0 / 3, 2: 2.0 / 3}},
		{"vote/a float of 1e30 in a 1-bit run is one vote", AggregateRobust, true, one(1, 1, 1, -1e30), want{1: 1.0 / 3}},
		{"vote/one peer alone", AggregateRobust, true, one(1, -1), want{1: -1}},
		{"vote/two peers agreeing", AggregateRobust, true, one(1, 1, 1), want{1: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := combined(tc.rule, tc.quantized, tc.frames)
			for ix, v := range got {
				w := tc.want[uint32(ix)]
				if math.Abs(float64(v-w)) > 1e-6*max(1, math.Abs(float64(w))) {
					t.Fatalf("coefficients %v, want %v at index %d (all: %v)", got, w, ix, tc.want)
				}
			}
		})
	}
}

// roundFrames makes the results of honest peers that train on similar data:
// a shared gradient plus each peer's own noise, so that their top-k choices
// mostly agree, as in a real round.
func roundFrames(t testing.TB, seed uint64, shapes [][]int, o Options, peers int) []*Frame {
	r := rand.New(rand.NewPCG(seed, 99))
	base := randomTensors(r, shapes, 1)
	var frames []*Frame
	for p := 0; p < peers; p++ {
		d, err := NewDeMo(shapes, o)
		if err != nil {
			t.Fatal(err)
		}
		noise := randomTensors(r, shapes, 0.5)
		for i := range noise {
			for j := range noise[i] {
				noise[i][j] += base[i][j]
			}
		}
		f, err := d.Step(noise, 0.1)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
	return frames
}

func cloneFrame(f *Frame) *Frame {
	g := &Frame{Tensors: slices.Clone(f.Tensors)}
	for i := range g.Tensors {
		g.Tensors[i].Shape = slices.Clone(f.Tensors[i].Shape)
		g.Tensors[i].Indices = slices.Clone(f.Tensors[i].Indices)
		g.Tensors[i].Values = slices.Clone(f.Tensors[i].Values)
	}
	return g
}

// poisoners are the attacks of the tests: each turns an honest peer's frame
// (the poisoner's own) into what it sends instead. r draws the noise.
func poisoners() []struct {
	name   string
	poison func(f *Frame, r *rand.Rand)
} {
	return []struct {
		name   string
		poison func(f *Frame, r *rand.Rand)
	}{
		{"values ±1e30 against its own", func(f *Frame, _ *rand.Rand) {
			// A 1-bit run refuses float frames (Check), so there the most a
			// poisoner can send is every sign against its own.
			for i := range f.Tensors {
				mag := 1e30
				if f.Tensors[i].Quantized {
					mag = 1
				}
				for j, v := range f.Tensors[i].Values {
					f.Tensors[i].Values[j] = float32(math.Copysign(mag, -float64(v)))
				}
			}
		}},
		{"flipped signs", func(f *Frame, _ *rand.Rand) {
			for i := range f.Tensors {
				for j, v := range f.Tensors[i].Values {
					f.Tensors[i].Values[j] = -v
				}
			}
		}},
		{"noise of the right shape", func(f *Frame, r *rand.Rand) {
			for i := range f.Tensors {
				t := &f.Tensors[i]
				size := uint32(t.TileH * t.TileW)
				var scale float64 // the frame's own magnitude, so clipping alone does not catch it
				for _, v := range t.Values {
					scale = max(scale, math.Abs(float64(v)))
				}
				for start := 0; start < len(t.Indices); start += t.K {
					picked := r.Perm(int(size))[:t.K]
					slices.Sort(picked)
					for j, ix := range picked {
						t.Indices[start+j] = uint32(ix)
						if t.Quantized {
							t.Values[start+j] = float32(1 - 2*r.IntN(2))
						} else {
							t.Values[start+j] = float32(r.NormFloat64() * scale)
						}
					}
				}
			}
		}},
	}
}

func aggregateWith(t testing.TB, shapes [][]int, o Options, frames []*Frame) [][]float32 {
	d, err := NewDeMo(shapes, o)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]float32, len(shapes))
	for i, p := range d.plans {
		out[i] = make([]float32, p.params)
	}
	if err := d.Aggregate(out, frames); err != nil {
		t.Fatal(err)
	}
	return out
}

// agreement is the fraction of entries of two directions that are equal.
func agreement(a, b [][]float32) float64 {
	same, n := 0, 0
	for i := range a {
		for j := range a[i] {
			if a[i][j] == b[i][j] {
				same++
			}
			n++
		}
	}
	return float64(same) / float64(n)
}

// TestRobustAggregationUnderAttack aggregates the frames of honest peers
// and of the same round with one peer replaced by a poisoner. The robust
// rule's direction must stay close to what the honest peers alone give,
// while the mean follows the ±1e30 poisoner; with honest peers only the
// robust direction is close to the mean's.
func TestRobustAggregationUnderAttack(t *testing.T) {
	shapes := [][]int{{64, 64}, {96, 40}, {50}}
	const peers = 7
	for _, quantized := range []bool{false, true} {
		t.Run(fmt.Sprintf("1bit=%v", quantized), func(t *testing.T) {
			o := Options{Chunk: 16, TopK: 8, Quantize1Bit: quantized, Decay: 0.9}
			frames := roundFrames(t, 1, shapes, o, peers)
			honest := frames[:peers-1]
			with := func(rule Aggregation, fs []*Frame) [][]float32 {
				o := o
				o.Aggregation = rule
				return aggregateWith(t, shapes, o, fs)
			}
			robustHonest, meanHonest := with(AggregateRobust, honest), with(AggregateMean, honest)
			if a := agreement(robustHonest, meanHonest); a < 0.85 {
				t.Errorf("honest peers only: robust and mean agree on %.3f of the signs, want ≥ 0.85", a)
			} else {
				t.Logf("honest peers only: robust and mean agree on %.3f of the signs", a)
			}
			for _, p := range poisoners() {
				bad := cloneFrame(frames[peers-1])
				p.poison(bad, rand.New(rand.NewPCG(5, 6)))
				poisoned := append(slices.Clone(honest), bad)
				robust, mean := agreement(with(AggregateRobust, poisoned), robustHonest), agreement(with(AggregateMean, poisoned), meanHonest)
				clipped := agreement(with(AggregateClippedMean, poisoned), meanHonest)
				t.Logf("%s: agreement with the honest direction: robust %.3f, clipped-mean %.3f, mean %.3f", p.name, robust, clipped, mean)
				if robust < 0.88 {
					t.Errorf("%s: the robust direction agrees with the honest one on %.3f of the signs, want ≥ 0.88", p.name, robust)
				}
				if p.name == "values ±1e30 against its own" && !quantized && !(mean < 0.75 && robust > mean+0.15) {
					t.Errorf("%s: the mean should follow the poisoner (agreement %.3f) where the robust rule does not (%.3f)", p.name, mean, robust)
				}
			}
		})
	}
}

// TestAggregationIgnoresFrameOrder aggregates the same frames (honest ones
// and poisoners') in shuffled orders and with different worker counts:
// every rule must give identical bytes, since every trainer must compute the
// same model.
func TestAggregationIgnoresFrameOrder(t *testing.T) {
	shapes := [][]int{{64, 64}, {96, 40}, {50}, {7}}
	r := rand.New(rand.NewPCG(7, 7))
	for _, quantized := range []bool{false, true} {
		o := Options{Chunk: 16, TopK: 8, Quantize1Bit: quantized, Decay: 0.9}
		frames := roundFrames(t, 2, shapes, o, 6)
		for pi, p := range poisoners() {
			bad := cloneFrame(frames[pi])
			p.poison(bad, r)
			frames = append(frames, bad)
		}
		frames = append(frames, cloneFrame(frames[0])) // a duplicate
		for rule := range numAggregations {
			o := o
			o.Aggregation = rule
			want := aggregateWith(t, shapes, o, frames)
			for try := range 8 {
				shuffled := slices.Clone(frames)
				r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				o.Workers = 1 + try%3
				got := aggregateWith(t, shapes, o, shuffled)
				for i := range want {
					for j := range want[i] {
						if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
							t.Fatalf("1bit=%v %s, order %d, %d workers: tensor %d entry %d is %v, was %v",
								quantized, rule, try, o.Workers, i, j, got[i][j], want[i][j])
						}
					}
				}
			}
		}
	}
}

// TestCombinedTileIgnoresFrameOrder checks the coefficients themselves
// (before the sign hides small differences) under every rule.
func TestCombinedTileIgnoresFrameOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	var frames []*Frame
	for range 9 {
		var es []entry
		for _, ix := range r.Perm(8)[:3] {
			es = append(es, entry{uint32(ix), float32(r.NormFloat64())})
		}
		slices.SortFunc(es, func(a, b entry) int { return int(a.ix) - int(b.ix) })
		frames = append(frames, tinyFrame(es...))
	}
	for rule := range numAggregations {
		want := combined(rule, false, frames)
		for range 20 {
			shuffled := slices.Clone(frames)
			r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			got := combined(rule, false, shuffled)
			for ix := range want {
				if math.Float32bits(got[ix]) != math.Float32bits(want[ix]) {
					t.Fatalf("%s: coefficient %d is %v in one order, %v in another", rule, ix, got[ix], want[ix])
				}
			}
		}
	}
}

func TestAggregationNames(t *testing.T) {
	for rule := range numAggregations {
		got, ok := ParseAggregation(rule.String())
		if !ok || got != rule {
			t.Errorf("%d: %q parses to %d, %v", rule, rule.String(), got, ok)
		}
	}
	if _, ok := ParseAggregation("median"); ok {
		t.Error("an unknown name parsed")
	}
	if _, err := NewDeMo([][]int{{8}}, Options{Chunk: 8, TopK: 1, Aggregation: numAggregations}); err == nil {
		t.Error("an unknown aggregation was accepted")
	}
}

// TestApplyWithNoFramesOnlyDecays: a round without results moves nothing
// but the weight decay, under every rule.
func TestApplyWithNoFramesOnlyDecays(t *testing.T) {
	for rule := range numAggregations {
		d, _ := NewDeMo([][]int{{8}}, Options{Chunk: 8, TopK: 1, WeightDecay: 0.5, Aggregation: rule})
		params := [][]float32{{1, 2, 3, 4, 5, 6, 7, 8}}
		if err := d.Apply(params, nil, 1); err != nil {
			t.Fatal(err)
		}
		if want := []float32{0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4}; !slices.Equal(params[0], want) {
			t.Errorf("%s: %v, want %v", rule, params[0], want)
		}
	}
}

// TestRobustLeavesOutDissenters: under the robust rule, frames whose signs
// disagree with their peers' more than chance allows are left out of the
// round while they are at most a third of it (⌊(n−1)/3⌋), so one or two
// sign-flippers among seven give exactly the honest peers' direction; three
// are too many to judge, and honest frames are never left out.
func TestRobustLeavesOutDissenters(t *testing.T) {
	shapes := [][]int{{64, 64}, {96, 40}, {50}}
	const peers = 7
	for _, quantized := range []bool{false, true} {
		o := Options{Chunk: 16, TopK: 8, Quantize1Bit: quantized, Decay: 0.9, Workers: 3}
		frames := roundFrames(t, 2, shapes, o, peers)
		d, err := NewDeMo(shapes, o)
		if err != nil {
			t.Fatal(err)
		}
		flipped := func(bad int) []*Frame {
			out := slices.Clone(frames)
			for i := range bad {
				f := cloneFrame(out[i])
				for ti := range f.Tensors {
					for j, v := range f.Tensors[ti].Values {
						f.Tensors[ti].Values[j] = -v
					}
				}
				out[i] = f
			}
			return out
		}
		for _, tc := range []struct {
			bad, kept int
		}{{0, peers}, {1, peers - 1}, {2, peers - 2}, {3, peers}} {
			fs := flipped(tc.bad)
			kept := d.withoutDissenters(canonicalOrder(fs))
			if len(kept) != tc.kept {
				t.Errorf("1-bit %v, %d flippers of %d: kept %d frames, want %d", quantized, tc.bad, peers, len(kept), tc.kept)
			}
			if tc.bad == 0 || tc.kept == peers {
				continue
			}
			for _, f := range kept {
				if slices.Index(fs, f) < tc.bad {
					t.Errorf("1-bit %v, %d flippers: a flipper was kept", quantized, tc.bad)
				}
			}
			o := o
			o.Aggregation = AggregateRobust
			got, want := aggregateWith(t, shapes, o, fs), aggregateWith(t, shapes, o, fs[tc.bad:])
			if a := agreement(got, want); a != 1 {
				t.Errorf("1-bit %v, %d flippers: the direction agrees with the honest peers' on %.3f, want all of it", quantized, tc.bad, a)
			}
		}
		if kept := d.withoutDissenters(canonicalOrder(frames[:3])); len(kept) != 3 {
			t.Errorf("three frames: kept %d, want all (too few to judge)", len(kept))
		}
	}
}
