package distro

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
)

// Aggregation is the rule that combines the peers' coefficients of a round
// into one dense tile before the inverse DCT and the sign. It is consensus:
// every trainer of a run must use the same rule (the run's model names it),
// or their models drift apart.
//
// A result's coefficient is one index of one tile. Each peer chose k per
// tile (its top-k), so most indices are sent by only some of the round's
// peers: the rules below speak of the senders of an index (c of them) among
// the round's peers (n frames).
type Aggregation uint8

const (
	// AggregateRobust is the default. Each peer's tile is first clipped to
	// the round's median tile norm (its k values scaled down to that L2
	// norm if above it), so no peer brings more energy to a tile than a
	// typical one. Then each index gets, in runs with float values, the
	// trimmed mean of its c values (⌊c/4⌋, at least 1, dropped from each
	// end once c ≥ 3) or, in 1-bit runs, the majority vote of the c signs
	// (Σ signs clamped to ±q, over q: a tie gives 0, no step). An index
	// sent by fewer than q = min(n, 3) peers cannot be trimmed, so it
	// counts as though the missing senders, up to q, had sent 0: its value
	// is the senders' sum over q. Three because it is the fewest values a
	// trimmed mean can check; it bounds a single peer's weight on an index
	// it alone chose to 1/3 (as much as one vote of three) without
	// dropping it: peers choose different top-k indices in honest runs
	// too, and dropping every index one peer chose would drop much of the
	// honest signal.
	AggregateRobust Aggregation = iota
	// AggregateMean is Psyche's rule (docs/architecture.md §6): each index gets the
	// mean of the values sent for it. One peer with huge values, or alone
	// on an index, decides it.
	AggregateMean
	// AggregateClippedMean clips every peer's tile to the median tile norm
	// as AggregateRobust does, then takes the mean. (In 1-bit runs every
	// honest tile has the same norm, √k, so it is the mean there.)
	AggregateClippedMean
	numAggregations
)

var aggregationNames = [...]string{"robust", "mean", "clipped-mean"}

// String is the rule's name in run files.
func (a Aggregation) String() string {
	if a < numAggregations {
		return aggregationNames[a]
	}
	return fmt.Sprintf("Aggregation(%d)", uint8(a))
}

// ParseAggregation returns the rule a run file names.
func ParseAggregation(name string) (Aggregation, bool) {
	for i, n := range aggregationNames {
		if n == name {
			return Aggregation(i), true
		}
	}
	return 0, false
}

// AggregationNames lists the rules' names, in enum order.
func AggregationNames() []string { return aggregationNames[:] }

// robustQuorum is q: the fewest senders an index needs to count fully (see
// AggregateRobust).
const robustQuorum = 3

// aggregate computes each tile's direction and hands it to emit, one tile row
// at a time (dst is the tensor, at the offset of the row's first element).
//
// The result depends only on the set of frames, bit for bit: the frames are
// put in a canonical order first (by content), every rule reads them in that
// order, and no sum depends on how tiles are split among workers.
func (p *Plan) aggregate(dst [][]float32, frames []*Frame, emit func(dst []float32, at int, dir []float32)) error {
	if err := p.checkTensors("output", dst); err != nil {
		return err
	}
	frames, err := p.roundFrames(frames)
	if err != nil {
		return err
	}
	for i, tp := range p.plans {
		ts := tp.tileSize()
		out := dst[i]
		parallel(p.opts.Workers, tp.tiles(), func(lo, hi int) {
			tile, tmp := make([]float32, ts), make([]float32, ts)
			c := newCombiner(p.opts, ts, tp.k, len(frames))
			for t := lo; t < hi; t++ {
				clear(tile)
				c.tile(tile, frames, i, t)
				tp.dct.inverse(tile, tmp)
				p.opts.Update.direction(tile)
				at := tp.origin(t)
				for r := 0; r < tp.th; r++ {
					emit(out, at+r*tp.cols, tile[r*tp.tw:(r+1)*tp.tw])
				}
			}
		})
	}
	return nil
}

// roundFrames checks a round's frames and returns those the rule reads, in
// the order it reads them: canonical order, less the dissenters under
// AggregateRobust.
func (p *Plan) roundFrames(frames []*Frame) ([]*Frame, error) {
	for fi, f := range frames {
		if err := p.Check(f); err != nil {
			return nil, fmt.Errorf("frame %d: %w", fi, err)
		}
	}
	frames = canonicalOrder(frames)
	if p.opts.Aggregation == AggregateRobust {
		frames = p.withoutDissenters(frames)
	}
	return frames, nil
}

// withoutDissenters returns frames less those whose signs disagree with
// their peers' more often than they agree, when there are few enough of
// them to be a minority (at most ⌊(n−1)/3⌋ of n frames; with fewer than 4
// frames nobody is left out). Only indices that the frame and at least two
// others sent count, each compared with the sign of the others' summed
// signs there (a tie of the others, or a value of 0, counts for nothing).
//
// Why: the per-index rules bound what one peer does to an index, but a
// peer that sends the negation of its gradient (or of anything honest)
// still subtracts its share from every index it sends, and with one such
// peer among four the loss after two epochs was 1.07–1.08× the honest one
// under robust (1-bit and float alike). Honest peers of a round are
// trained on the same model from the same distribution, so their signs
// agree on more indices than not; a sign-flipper's therefore disagree on
// more than not. The count runs over the whole frame (thousands of
// indices), so an honest frame is not left out by chance; a frame is
// judged only by its signs, so a peer that flips a few of its own stays in
// and does that little harm. Integer counts: the verdict does not depend
// on how tiles are split among workers.
func (p *Plan) withoutDissenters(frames []*Frame) []*Frame {
	n := len(frames)
	if n < 4 {
		return frames
	}
	agree, disagree := make([]int64, n), make([]int64, n)
	var mu sync.Mutex
	for i, tp := range p.plans {
		ts, k := tp.tileSize(), tp.k
		parallel(p.opts.Workers, tp.tiles(), func(lo, hi int) {
			sum, count := make([]int32, ts), make([]int32, ts)
			a, x := make([]int64, n), make([]int64, n)
			for t := lo; t < hi; t++ {
				for _, f := range frames {
					ft := &f.Tensors[i]
					vals := ft.Values[t*k : (t+1)*k]
					for j, ix := range ft.Indices[t*k : (t+1)*k] {
						sum[ix] += signOf(vals[j])
						count[ix]++
					}
				}
				for fi, f := range frames {
					ft := &f.Tensors[i]
					vals := ft.Values[t*k : (t+1)*k]
					for j, ix := range ft.Indices[t*k : (t+1)*k] {
						s := signOf(vals[j])
						if count[ix] < 3 || s == 0 {
							continue
						}
						switch others := sum[ix] - s; {
						case others*s > 0:
							a[fi]++
						case others*s < 0:
							x[fi]++
						}
					}
				}
				for _, f := range frames {
					for _, ix := range f.Tensors[i].Indices[t*k : (t+1)*k] {
						sum[ix], count[ix] = 0, 0
					}
				}
			}
			mu.Lock()
			for fi := range n {
				agree[fi] += a[fi]
				disagree[fi] += x[fi]
			}
			mu.Unlock()
		})
	}
	var dissent []int
	for fi := range n {
		// More disagreements than a fair coin would give in two standard
		// deviations: (x−a)² > 4(a+x), so that a frame judged on a handful
		// of indices (late in a run, few indices have three senders) is
		// not left out by chance.
		if x, a := disagree[fi], agree[fi]; x > a && (x-a)*(x-a) > 4*(a+x) {
			dissent = append(dissent, fi)
		}
	}
	if len(dissent) == 0 || len(dissent) > (n-1)/3 {
		return frames
	}
	kept := make([]*Frame, 0, n-len(dissent))
	for fi, f := range frames {
		if !slices.Contains(dissent, fi) {
			kept = append(kept, f)
		}
	}
	return kept
}

func signOf(v float32) int32 {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

// canonicalOrder returns the frames sorted by content (a copy of the slice:
// the caller's order is left alone). Frames that compare equal are
// identical as far as aggregation reads them, so their order does not
// matter.
func canonicalOrder(frames []*Frame) []*Frame {
	sorted := slices.Clone(frames)
	slices.SortFunc(sorted, compareFrames)
	return sorted
}

// compareFrames orders frames of the same model by their indices, then their
// values (as totalOrder keys), tensor by tensor.
func compareFrames(a, b *Frame) int {
	for i := range a.Tensors {
		ta, tb := &a.Tensors[i], &b.Tensors[i]
		if c := slices.Compare(ta.Indices, tb.Indices); c != 0 {
			return c
		}
		if c := slices.CompareFunc(ta.Values, tb.Values, compareValues); c != 0 {
			return c
		}
	}
	return 0
}

func compareValues(x, y float32) int { return cmp.Compare(totalOrder(x), totalOrder(y)) }

// totalOrder maps a float to a key whose unsigned order is the numeric
// order, with −0 before +0, so that sorting is the same on every machine
// whatever the input order.
func totalOrder(x float32) uint32 {
	b := math.Float32bits(x)
	if b>>31 != 0 {
		return ^b
	}
	return b | 1<<31
}

// combiner fills one tile's dense coefficients from the frames under one
// rule; each worker has its own (the scratch is per tile size and round).
type combiner struct {
	rule      Aggregation
	quantized bool // the run sends 1-bit signs: the robust rule votes
	k         int
	count     []int32   // per index of the tile; all 0 between tiles
	start     []int32   // per index: where its values begin in vals
	touched   []uint32  // indices some frame sent, in first-seen order
	vals      []float32 // the values sent, grouped by index
	norms     []float64 // per frame: its tile's L2 norm
	sorted    []float64
	scale     []float64 // per frame: its clipping factor for the tile
}

func newCombiner(o Options, tileSize, k, frames int) *combiner {
	return &combiner{rule: o.Aggregation, quantized: o.Quantize1Bit, k: k,
		count: make([]int32, tileSize), start: make([]int32, tileSize),
		touched: make([]uint32, 0, k*frames), vals: make([]float32, k*frames),
		norms: make([]float64, frames), sorted: make([]float64, frames), scale: make([]float64, frames)}
}

// tile writes to tile (zeroed) the combined coefficients of tile t of tensor
// i.
func (c *combiner) tile(tile []float32, frames []*Frame, i, t int) {
	if len(frames) == 0 {
		return
	}
	if c.rule == AggregateMean {
		c.mean(tile, frames, i, t)
		return
	}
	k := c.k
	vote := c.rule == AggregateRobust && c.quantized
	if !vote {
		c.clip(frames, i, t)
	}
	// Group the values by index: count, lay out, fill (count doubles as
	// the fill cursor). Within a group the values are in frame order.
	c.touched = c.touched[:0]
	for _, f := range frames {
		for _, ix := range f.Tensors[i].Indices[t*k : (t+1)*k] {
			if c.count[ix] == 0 {
				c.touched = append(c.touched, ix)
			}
			c.count[ix]++
		}
	}
	var at int32
	for _, ix := range c.touched {
		c.start[ix] = at
		at += c.count[ix]
		c.count[ix] = 0
	}
	for fi, f := range frames {
		ft := &f.Tensors[i]
		vals := ft.Values[t*k : (t+1)*k]
		for j, ix := range ft.Indices[t*k : (t+1)*k] {
			v := vals[j]
			if !vote && c.scale[fi] != 1 {
				v = float32(float64(v) * c.scale[fi])
			}
			c.vals[c.start[ix]+c.count[ix]] = v
			c.count[ix]++
		}
	}
	q := min(len(frames), robustQuorum)
	for _, ix := range c.touched {
		g := c.vals[c.start[ix] : c.start[ix]+c.count[ix]]
		c.count[ix] = 0
		switch {
		case vote:
			tile[ix] = signVote(g, q)
		case c.rule == AggregateRobust:
			tile[ix] = trimmedMean(g, q)
		default:
			tile[ix] = mean(g)
		}
	}
}

// mean is Psyche's rule: the plain per-index average, in float32 as it
// always was (the frames are in canonical order, so the sums are too; a
// decoded frame's values are within ±MaxValue, so the sums are finite).
func (c *combiner) mean(tile []float32, frames []*Frame, i, t int) {
	k := c.k
	c.touched = c.touched[:0]
	for _, f := range frames {
		ft := &f.Tensors[i]
		vals := ft.Values[t*k : (t+1)*k]
		for j, ix := range ft.Indices[t*k : (t+1)*k] {
			if c.count[ix] == 0 {
				c.touched = append(c.touched, ix)
			}
			tile[ix] += vals[j]
			c.count[ix]++
		}
	}
	for _, ix := range c.touched {
		if n := c.count[ix]; n > 1 {
			tile[ix] /= float32(n)
		}
		c.count[ix] = 0
	}
}

// clip sets each frame's clipping factor for tile t: 1, or the round's
// median tile norm over its own norm when it is above it. The median is the
// lower one (element ⌊(n−1)/2⌋ of the sorted norms), so with two peers the
// larger is clipped to the smaller: a poisoner facing one honest peer gets
// no more than the honest norm. Norms are summed in float64 (a decoded
// frame's values are within ±MaxValue, but a Frame built in process may
// carry values up to float32's maximum, whose squares a float32 cannot
// hold), each product converted explicitly so that no compiler fuses it
// into a multiply-add and changes the bits on some machines.
func (c *combiner) clip(frames []*Frame, i, t int) {
	k := c.k
	for fi, f := range frames {
		var s float64
		for _, v := range f.Tensors[i].Values[t*k : (t+1)*k] {
			s += float64(float64(v) * float64(v))
		}
		c.norms[fi] = math.Sqrt(s)
	}
	copy(c.sorted, c.norms)
	slices.Sort(c.sorted)
	med := c.sorted[(len(frames)-1)/2]
	for fi, n := range c.norms {
		c.scale[fi] = 1
		if n > med {
			c.scale[fi] = med / n
		}
	}
}

func mean(g []float32) float32 {
	var s float64
	for _, v := range g {
		s += float64(v)
	}
	return float32(s / float64(len(g)))
}

// trimmedMean is the robust rule for float values: sort, drop ⌊c/4⌋ (at
// least 1) values from each end once c ≥ 3, average the rest, and weigh the
// result by min(c, q)/q (an index too few peers sent to be trimmed counts as
// if the missing senders had sent 0). Sorting first makes the result
// independent of the order of g.
func trimmedMean(g []float32, q int) float32 {
	sortValues(g)
	c := len(g)
	drop := 0
	if c >= robustQuorum {
		drop = max(1, c/4)
	}
	kept := g[drop : c-drop]
	var s float64
	for _, v := range kept {
		s += float64(v)
	}
	if c < q {
		// Fewer than q ≤ 3 senders are never trimmed: dividing their sum
		// by q instead of c is their mean weighed by c/q.
		return float32(s / float64(q))
	}
	return float32(s / float64(len(kept)))
}

// signVote is the robust rule for 1-bit runs: the senders' signs summed
// (a value counts by its sign, so a float value in a 1-bit run is one vote
// like any other), clamped to ±q and divided by q. The sign is the
// majority's, a tie gives 0 (this index adds nothing), and no single vote
// moves the result by more than 1/q (2/q if it flips).
func signVote(g []float32, q int) float32 {
	n := 0
	for _, v := range g {
		switch {
		case v > 0:
			n++
		case v < 0:
			n--
		}
	}
	return float32(max(-q, min(q, n))) / float32(q)
}

// sortValues sorts g by totalOrder (insertion sort for the small groups that
// are the common case).
func sortValues(g []float32) {
	if len(g) > 12 {
		slices.SortFunc(g, compareValues)
		return
	}
	for i := 1; i < len(g); i++ {
		for j := i; j > 0 && totalOrder(g[j]) < totalOrder(g[j-1]); j-- {
			g[j], g[j-1] = g[j-1], g[j]
		}
	}
}
