package distro

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// TestUpdateRuleDirections pins each rule on tiles small enough to work out
// by hand.
func TestUpdateRuleDirections(t *testing.T) {
	for _, tc := range []struct {
		rule     UpdateRule
		in, want []float32
	}{
		{UpdateSign, []float32{0.5, -2, 0, 1e-9}, []float32{1, -1, 0, 1}},
		{UpdateRMS, []float32{3, -4, 0, 0}, []float32{1.2, -1.6, 0, 0}}, // RMS 2.5
		{UpdateRMS, []float32{2, 2, 2, 2}, []float32{1, 1, 1, 1}},
		{UpdateRMS, []float32{0, 0, 0}, []float32{0, 0, 0}},                               // nothing to move
		{UpdateRMS, []float32{1e-30, 0, 0, 0}, []float32{2, 0, 0, 0}},                     // tiny tiles still get unit RMS
		{UpdateRMS, []float32{3e38, -3e38, 0, 0}, []float32{1.4142135, -1.4142135, 0, 0}}, // squares beyond float32
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.rule, tc.in), func(t *testing.T) {
			got := slices.Clone(tc.in)
			tc.rule.direction(got)
			for j := range got {
				if math.Abs(float64(got[j]-tc.want[j])) > 1e-6 {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
			if tc.rule == UpdateRMS {
				var s float64
				for _, v := range got {
					s += float64(v) * float64(v)
				}
				if rms := math.Sqrt(s / float64(len(got))); s != 0 && math.Abs(rms-1) > 1e-6 {
					t.Errorf("RMS %v, want 1", rms)
				}
			}
		})
	}
}

func TestUpdateRuleNames(t *testing.T) {
	for u := range numUpdateRules {
		got, ok := ParseUpdateRule(u.String())
		if !ok || got != u {
			t.Errorf("%d: %q parses to %d, %v", u, u.String(), got, ok)
		}
	}
	if _, ok := ParseUpdateRule("lion"); ok {
		t.Error("an unknown name parsed")
	}
	if _, err := NewDeMo([][]int{{8}}, Options{Chunk: 8, TopK: 1, Update: numUpdateRules}); err == nil {
		t.Error("an unknown update rule was accepted")
	}
}

// TestRMSUpdateFollowsTheAggregate: under UpdateRMS a step is the sign
// rule's decoded aggregate, scaled per tile to unit RMS, so it points the
// same way as sign on nearly every parameter and has the same energy per
// tile; it is independent of the frames' order and of the worker count.
func TestRMSUpdateFollowsTheAggregate(t *testing.T) {
	shapes := [][]int{{64, 64}, {96, 40}, {50}}
	o := Options{Chunk: 16, TopK: 8, Quantize1Bit: true, Decay: 0.9}
	frames := roundFrames(t, 3, shapes, o, 5)
	sign := aggregateWith(t, shapes, o, frames)
	o.Update = UpdateRMS
	rms := aggregateWith(t, shapes, o, frames)
	o.Workers = 3
	reversed := slices.Clone(frames)
	slices.Reverse(reversed)
	again := aggregateWith(t, shapes, o, reversed)
	agree, n := 0, 0
	var energy, cells float64
	for i := range rms {
		if !slices.Equal(rms[i], again[i]) {
			t.Fatalf("tensor %d differs with the frames reversed and 3 workers", i)
		}
		for j, v := range rms[i] {
			if (v > 0) == (sign[i][j] > 0) && (v < 0) == (sign[i][j] < 0) {
				agree++
			}
			n++
			energy += float64(v) * float64(v)
			cells++
		}
	}
	if a := float64(agree) / float64(n); a < 0.99 {
		t.Errorf("RMS and sign steps agree on %.3f of the signs, want ≥ 0.99", a)
	}
	if ms := energy / cells; math.Abs(ms-1) > 0.01 {
		t.Errorf("mean square step %.4f, want ≈ 1 (every tile scaled to unit RMS)", ms)
	}
}

func TestRMSUpdateConvergesOnAQuadratic(t *testing.T) {
	testConvergesOnAQuadraticWith(t, AggregateRobust, UpdateRMS)
}

func TestAdamUpdateConvergesOnAQuadratic(t *testing.T) {
	testConvergesOnAQuadraticWith(t, AggregateRobust, UpdateAdam)
}

func TestRMSClipUpdateConvergesOnAQuadratic(t *testing.T) {
	testConvergesOnAQuadraticWith(t, AggregateRobust, UpdateRMSClip)
}

// TestAdamUpdateKeepsTheAggregateAsItsGradient: the first step of
// UpdateAdam is, bias-corrected, a/|a| = sign(a) on every parameter the
// aggregate moves (lr 1, no weight decay), and Aggregate reports the raw
// decoded aggregate.
func TestAdamUpdateKeepsTheAggregateAsItsGradient(t *testing.T) {
	shapes := [][]int{{32, 32}, {50}}
	o := Options{Chunk: 16, TopK: 8, Quantize1Bit: true, Decay: 0.9}
	frames := roundFrames(t, 4, shapes, o, 3)
	sign := aggregateWith(t, shapes, o, frames)
	o.Update = UpdateAdam
	d, err := NewDeMo(shapes, o)
	if err != nil {
		t.Fatal(err)
	}
	params := [][]float32{make([]float32, 32*32), make([]float32, 50)}
	if err := d.Apply(params, frames, 1); err != nil {
		t.Fatal(err)
	}
	for i := range params {
		for j, p := range params[i] {
			if math.Abs(float64(p+sign[i][j])) > 1e-4 {
				t.Fatalf("tensor %d [%d]: step %v, sign of the aggregate %v", i, j, -p, sign[i][j])
			}
		}
	}
}
