package distro

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

func TestLargestDivisor(t *testing.T) {
	for _, tc := range []struct{ n, c, want int }{
		{4096, 64, 64}, {768, 64, 64}, {50257, 64, 29}, {50261, 64, 1}, {10, 64, 10}, {96, 64, 48}, {1, 64, 1}, {7, 1, 1},
	} {
		if got := LargestDivisor(tc.n, tc.c); got != tc.want {
			t.Errorf("LargestDivisor(%d, %d) = %d, want %d", tc.n, tc.c, got, tc.want)
		}
	}
}

// topKReference sorts everything: magnitude descending, index ascending.
func topKReference(c []float32, k int) []uint32 {
	order := make([]int, len(c))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return abs32(c[order[a]]) > abs32(c[order[b]]) })
	out := make([]uint32, k)
	for i := range out {
		out[i] = uint32(order[i])
	}
	slices.Sort(out)
	return out
}

func abs32(v float32) float32 { return float32(math.Abs(float64(v))) }

func TestTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	cases := [][]float32{
		{1, -3, 2, 3, -1},     // tie at 3 between indices 1 and 3
		{0, 0, 0, 0},          // all ties
		{-1, 1, -1, 1, -1, 1}, // ties with mixed signs
		{5},
	}
	for i := 0; i < 20; i++ {
		c := make([]float32, 4096)
		for j := range c {
			c[j] = float32(r.IntN(21) - 10) // many ties
		}
		cases = append(cases, c)
	}
	for _, c := range cases {
		for _, k := range []int{1, 2, 4, 32, len(c)} {
			if k > len(c) {
				continue
			}
			idx := make([]uint32, k)
			topK(c, idx, make([]uint32, k))
			if want := topKReference(c, k); !slices.Equal(idx, want) {
				t.Fatalf("k=%d of %v...: got %v, want %v", k, c[:min(8, len(c))], idx, want)
			}
		}
	}
}

func testShapes() [][]int { return [][]int{{64, 64}, {96, 40}, {50}, {2, 3, 16, 24}, {7}} }

func randomTensors(r *rand.Rand, shapes [][]int, scale float64) [][]float32 {
	out := make([][]float32, len(shapes))
	for i, s := range shapes {
		n := 1
		for _, d := range s {
			n *= d
		}
		out[i] = make([]float32, n)
		for j := range out[i] {
			out[i][j] = float32(r.NormFloat64() * scale)
		}
	}
	return out
}

// referenceDeMo is the optimizer exactly as docs/architecture.md §6 states it, written
// slowly: momentum in the parameter domain, a direct-sum DCT per tile, top-k
// by sorting, and the residual by subtracting the inverse DCT of what was sent.
type referenceDeMo struct {
	opts  Options
	plans []*tensorPlan
	delta [][]float64
}

func (r *referenceDeMo) step(grads [][]float32, lr float32) [][]uint32 {
	var sent [][]uint32
	for i, p := range r.plans {
		for j, g := range grads[i] {
			r.delta[i][j] = float64(r.opts.Decay)*r.delta[i][j] + float64(lr)*float64(g)
		}
		var idxs []uint32
		for t := 0; t < p.tiles(); t++ {
			tile := make([]float32, p.tileSize())
			at := p.origin(t)
			for a := 0; a < p.th; a++ {
				for b := 0; b < p.tw; b++ {
					tile[a*p.tw+b] = float32(r.delta[i][at+a*p.cols+b])
				}
			}
			coef := referenceDCT2(tile, p.th, p.tw)
			c32 := make([]float32, len(coef))
			for j, v := range coef {
				c32[j] = float32(v)
			}
			idx := topKReference(c32, p.k)
			idxs = append(idxs, idx...)
			// residual: subtract the inverse DCT of the sent coefficients
			sparse := make([]float32, len(coef))
			for _, ix := range idx {
				sparse[ix] = c32[ix]
			}
			p.dct.inverse(sparse, make([]float32, len(sparse)))
			for a := 0; a < p.th; a++ {
				for b := 0; b < p.tw; b++ {
					r.delta[i][at+a*p.cols+b] -= float64(sparse[a*p.tw+b])
				}
			}
		}
		sent = append(sent, idxs)
	}
	return sent
}

func TestStepMatchesTheSpecification(t *testing.T) {
	shapes := [][]int{{16, 24}, {30}, {2, 8, 8}}
	opts := Options{Chunk: 8, TopK: 3, Decay: 0.9}
	d, err := NewDeMo(shapes, opts)
	if err != nil {
		t.Fatal(err)
	}
	ref := &referenceDeMo{opts: opts, plans: d.plans}
	for _, p := range d.plans {
		ref.delta = append(ref.delta, make([]float64, p.params))
	}
	r := rand.New(rand.NewPCG(9, 9))
	agree, total := 0, 0
	for step := 0; step < 5; step++ {
		grads := randomTensors(r, shapes, 1)
		f, err := d.Step(grads, 0.1)
		if err != nil {
			t.Fatal(err)
		}
		want := ref.step(grads, 0.1)
		for i := range shapes {
			for j, ix := range f.Tensors[i].Indices {
				total++
				if ix == want[i][j] {
					agree++
				}
			}
		}
		// The momentum, brought back to the parameter domain, matches.
		for i, p := range d.plans {
			back := make([]float32, p.params)
			for tt := 0; tt < p.tiles(); tt++ {
				tile := append([]float32(nil), d.delta[i][tt*p.tileSize():(tt+1)*p.tileSize()]...)
				p.dct.inverse(tile, make([]float32, len(tile)))
				at := p.origin(tt)
				for a := 0; a < p.th; a++ {
					copy(back[at+a*p.cols:], tile[a*p.tw:(a+1)*p.tw])
				}
			}
			if e := relErr(back, ref.delta[i]); e > 1e-4 {
				t.Fatalf("step %d tensor %d: momentum differs from the specification by %.2g", step, i, e)
			}
		}
	}
	// Rounding can reorder near-equal magnitudes; anything beyond that is a bug.
	if agree < total*98/100 {
		t.Fatalf("only %d of %d selected coefficients agree with the specification", agree, total)
	}
}

func TestStepIsDeterministicAcrossWorkers(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	shapes := testShapes()
	grads := randomTensors(r, shapes, 1)
	var frames [][]byte
	for _, w := range []int{1, 2, 5} {
		d, err := NewDeMo(shapes, Options{Chunk: 16, TopK: 4, Quantize1Bit: true, Decay: 0.99, Workers: w})
		if err != nil {
			t.Fatal(err)
		}
		f, err := d.Step(grads, 0.01)
		if err != nil {
			t.Fatal(err)
		}
		b, err := f.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, b)
	}
	if !bytes.Equal(frames[0], frames[1]) || !bytes.Equal(frames[0], frames[2]) {
		t.Fatal("frames depend on the number of workers")
	}
}

func TestStepRejectsBadGradients(t *testing.T) {
	d, _ := NewDeMo([][]int{{4, 4}}, Options{Chunk: 4, TopK: 2})
	for _, g := range [][]float32{
		append(make([]float32, 15), float32(math.NaN())),
		append(make([]float32, 15), float32(math.Inf(-1))),
	} {
		if _, err := d.Step([][]float32{g}, 0.1); !errors.Is(err, ErrNonFinite) {
			t.Errorf("got %v", err)
		}
	}
	if _, err := d.Step([][]float32{make([]float32, 3)}, 0.1); err == nil {
		t.Error("wrong size accepted")
	}
	if m := d.Momentum(0); slices.ContainsFunc(m, func(v float32) bool { return v != 0 }) {
		t.Error("a rejected step changed the momentum")
	}
}

func TestAggregateAveragesDuplicates(t *testing.T) {
	d, _ := NewDeMo([][]int{{8}}, Options{Chunk: 8, TopK: 1, Aggregation: AggregateMean})
	frame := func(ix uint32, v float32) *Frame {
		return &Frame{Tensors: []Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 1, Indices: []uint32{ix}, Values: []float32{v}}}}
	}
	out := [][]float32{make([]float32, 8)}
	// Coefficient 1 (a half cosine: positive then negative) from two peers
	// that disagree on its size but not its sign: the average's sign is the
	// basis function's sign.
	if err := d.Aggregate(out, []*Frame{frame(1, 3), frame(1, 1)}); err != nil {
		t.Fatal(err)
	}
	want := []float32{1, 1, 1, 1, -1, -1, -1, -1}
	if !slices.Equal(out[0], want) {
		t.Fatalf("got %v, want %v", out[0], want)
	}
	// Equal and opposite: the average is zero and so is the direction.
	if err := d.Aggregate(out, []*Frame{frame(1, 2), frame(1, -2)}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out[0], make([]float32, 8)) {
		t.Fatalf("got %v, want zeros", out[0])
	}
}

func TestAggregateRejectsMismatchedFrames(t *testing.T) {
	d, _ := NewDeMo([][]int{{8, 8}}, Options{Chunk: 8, TopK: 2})
	good, _ := d.Step([][]float32{make([]float32, 64)}, 1)
	other, _ := NewDeMo([][]int{{8, 8}}, Options{Chunk: 4, TopK: 2})
	wrongTiles, _ := other.Step([][]float32{make([]float32, 64)}, 1)
	for _, f := range []*Frame{{}, wrongTiles, {Tensors: []Tensor{{Shape: []int{64}, TileH: 1, TileW: 8, K: 2}}}} {
		if err := d.Aggregate([][]float32{make([]float32, 64)}, []*Frame{good, f}); !errors.Is(err, ErrMismatch) {
			t.Errorf("got %v", err)
		}
	}
}

// TestDistroConvergesOnAQuadratic minimizes Σ a_i(θ_i − target_i)²/2 with four
// simulated peers, each seeing its own noisy gradient; every peer applies all
// four results, as after a round's consensus; under every aggregation rule.
func TestDistroConvergesOnAQuadratic(t *testing.T) {
	for rule := range numAggregations {
		t.Run(rule.String(), func(t *testing.T) { testConvergesOnAQuadratic(t, rule) })
	}
}

func testConvergesOnAQuadratic(t *testing.T, rule Aggregation) {
	testConvergesOnAQuadraticWith(t, rule, UpdateSign)
}

func testConvergesOnAQuadraticWith(t *testing.T, rule Aggregation, update UpdateRule) {
	r := rand.New(rand.NewPCG(11, 12))
	shapes := [][]int{{32, 32}, {48}}
	target := randomTensors(r, shapes, 1)
	curv := randomTensors(r, shapes, 1)
	for i := range curv {
		for j := range curv[i] {
			curv[i][j] = 0.5 + abs32(curv[i][j])
		}
	}
	params := randomTensors(r, shapes, 0) // start at zero
	dist := func() float64 { return relErrTensors(params, target) }
	start := dist()
	const peers, steps = 4, 400
	opts := Options{Chunk: 8, TopK: 8, Quantize1Bit: true, Decay: 0.9, Aggregation: rule, Update: update}
	var opt [peers]*DeMo
	for p := range opt {
		opt[p], _ = NewDeMo(shapes, opts)
	}
	for s := 0; s < steps; s++ {
		lr := float32(0.02 * (0.5 + 0.5*math.Cos(math.Pi*float64(s)/steps)))
		var frames []*Frame
		for p := 0; p < peers; p++ {
			grads := make([][]float32, len(shapes))
			for i := range shapes {
				grads[i] = make([]float32, len(params[i]))
				for j := range grads[i] {
					grads[i][j] = curv[i][j]*(params[i][j]-target[i][j]) + float32(r.NormFloat64()*0.1)
				}
			}
			f, err := opt[p].Step(grads, lr)
			if err != nil {
				t.Fatal(err)
			}
			frames = append(frames, f)
		}
		if err := opt[0].Apply(params, frames, lr); err != nil {
			t.Fatal(err)
		}
	}
	end := dist()
	t.Logf("relative distance to the optimum: %.3f -> %.4f", start, end)
	if end > 0.05 {
		t.Fatalf("did not converge: relative distance %.4f (started at %.3f)", end, start)
	}
}

func relErrTensors(a, b [][]float32) float64 {
	var num, den float64
	for i := range a {
		for j := range a[i] {
			d := float64(a[i][j] - b[i][j])
			num += d * d
			den += float64(b[i][j]) * float64(b[i][j])
		}
	}
	return math.Sqrt(num / den)
}

func TestAdamWConvergesOnAQuadratic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	shapes := [][]int{{100}}
	target := randomTensors(r, shapes, 1)
	params := randomTensors(r, shapes, 0)
	a := NewAdamW([]int{100}, 0.9, 0.999, 1e-8, 0)
	for s := 0; s < 500; s++ {
		g := make([]float32, 100)
		for j := range g {
			g[j] = params[0][j] - target[0][j]
		}
		if err := a.Step(params, [][]float32{g}, 0.05*float32(1-float64(s)/500)); err != nil {
			t.Fatal(err)
		}
	}
	if e := relErrTensors(params, target); e > 0.01 {
		t.Fatalf("relative distance %.4f", e)
	}
}

func TestSigns(t *testing.T) {
	v := []float32{3, -2, 0, float32(math.Copysign(0, -1)), 1e-40, -1e-40, float32(math.Inf(1))}
	signs(v)
	if want := []float32{1, -1, 0, 0, 1, -1, 1}; !slices.Equal(v, want) {
		t.Fatalf("got %v, want %v", v, want)
	}
}

// TestNormalizeTile checks the RMS normalization against a direct float64
// computation over a few steps, and that tiles of zeros stay zeros.
func TestNormalizeTile(t *testing.T) {
	steps := [][]float32{
		{3, -4, 0, 0.5, 1e-3, -2},
		{3, 4, 0, -0.5, 1e-3, 0},
		{-6, 0, 0, 0.25, 2e-3, 1},
	}
	for _, tc := range []struct {
		name  string
		scale float32
	}{{"unit", 1}, {"tiny", 1e-15}, {"huge", 1e15}, {"zeros", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			v := make([]float32, len(steps[0]))
			want := make([]float64, len(v))
			for s, raw := range steps {
				unbias := 1 / (1 - math.Pow(normBeta, float64(s+1)))
				c := make([]float32, len(raw))
				var sum float64
				for j, x := range raw {
					c[j] = x * tc.scale
					want[j] = normBeta*want[j] + (1-normBeta)*float64(c[j])*float64(c[j])
					sum += want[j]
				}
				in := slices.Clone(c)
				normalizeTile(c, v, float32(unbias))
				floor := normFloor * math.Sqrt(sum/float64(len(c))*unbias)
				for j, x := range in {
					exp := 0.0
					if den := math.Sqrt(want[j]*unbias) + floor; den > 0 {
						exp = float64(x) / den
					}
					if math.IsNaN(float64(c[j])) || math.Abs(float64(c[j])-exp) > 1e-5*max(1, math.Abs(exp)) {
						t.Fatalf("step %d coefficient %d: %g, want %g", s, j, c[j], exp)
					}
				}
			}
		})
	}
	// The first step divides each coefficient by nearly its own magnitude.
	c, v := []float32{8, -0.001}, make([]float32, 2)
	normalizeTile(c, v, 1/(1-normBeta))
	if !(c[0] > 0.9 && c[0] < 1 && c[1] < -0.001/(0.001+0.1*8/math.Sqrt2)*0.99) {
		t.Fatalf("first step: %v", c)
	}
}

// TestNormalizedStepSendsConsistentCoefficients: a tile whose lowest
// frequency flips between ±100 every step (noise) and whose eighth is +1
// every step (signal). Raw momentum sends the loud coefficient every step
// and never the signal; normalized, each counts against its own scale, and
// the consistent one is sent within three steps.
func TestNormalizedStepSendsConsistentCoefficients(t *testing.T) {
	for _, normalize := range []bool{false, true} {
		d, err := NewDeMo([][]int{{64}}, Options{Chunk: 64, TopK: 1, Quantize1Bit: true, Decay: 0.9, NormalizeRMS: normalize})
		if err != nil {
			t.Fatal(err)
		}
		sentAt := 0
		for step := 1; step <= 10 && sentAt == 0; step++ {
			c, tmp := make([]float32, 64), make([]float32, 64)
			c[0], c[7] = 100, 1
			if step%2 == 0 {
				c[0] = -100
			}
			d.plans[0].dct.inverse(c, tmp) // the gradient whose DCT is c
			f, err := d.Step([][]float32{c}, 0.01)
			if err != nil {
				t.Fatal(err)
			}
			if f.Tensors[0].Indices[0] == 7 {
				sentAt = step
			}
		}
		if normalize && (sentAt == 0 || sentAt > 3) || !normalize && sentAt != 0 {
			t.Errorf("normalize %v: the consistent coefficient was first sent at step %d (0: never in 10)", normalize, sentAt)
		}
	}
}

// TestNormalizedZeroGradient: a zero gradient (a tensor no token reached)
// keeps a zero, finite momentum under NormalizeRMS, and its tiles still
// send k coefficients.
func TestNormalizedZeroGradient(t *testing.T) {
	d, _ := NewDeMo([][]int{{16, 16}}, Options{Chunk: 16, TopK: 4, Quantize1Bit: true, Decay: 0.9, NormalizeRMS: true})
	f, err := d.Step([][]float32{make([]float32, 256)}, 0.01)
	if err != nil || !allFinite(d.delta[0]) || slices.ContainsFunc(d.delta[0], func(x float32) bool { return x != 0 }) || len(f.Tensors[0].Indices) != 4 {
		t.Fatalf("zero gradient: %v, momentum %v", err, d.delta[0][:8])
	}
}
