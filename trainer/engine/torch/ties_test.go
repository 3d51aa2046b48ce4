package torch

import (
	"fmt"
	"math"
	"testing"

	"github.com/psyche-go/psyche/distro"
)

// Two optimizers that compute the same momentum in float32 by different
// roads (another DCT algorithm, a gradient summed in another order) hold
// coefficients a few roundings apart. Where a tile's k-th and (k+1)-th
// largest magnitudes lie that close, the two may choose differently, and
// no test may depend on which way such a near-tie falls: how often one
// occurs moves with the machine, the BLAS and the threads. So the frames
// are compared against a bound on how far the two optimizers' coefficients
// can lie apart, derived from float32's rounding and the measured inputs
// (per tile from two gradients, gradientBound; per coefficient against
// the momentum computed exactly, exactMomentum): a tile whose choices
// differ is a near-tie only when the coefficients swapped lie within that
// bound of each other, and every other tile must choose exactly alike.

// unit is float32's unit roundoff.
const unit = 0x1p-24

// dctErr bounds, per unit of a tile's L2 norm, how far two float32
// (inverse) DCTs of the same tile may give one coefficient apart. Torch's
// coefficient is a sum of TileW products, then of TileH, each basis entry
// rounded too, and |a sum's error| <= terms·u·Σ|basis·x| <= terms·u·|x|
// (a basis row has norm 1): (TileH+TileW+2)·u·|x| in all, to first order.
// Go's fast transform (Lee's) is held to the same: TestFrameParity checks
// both engines' coefficients against the exact ones within it. Two such
// transforms: twice that.
func dctErr(l distro.TileLayout) float64 { return 2 * float64(l.TileH+l.TileW+2) * unit }

// tileOf is the tile of element e of a tensor of layout l and the
// element's row and column within it.
func tileOf(l distro.TileLayout, e int) (tile, r, c int) {
	o, row, col := e/(l.Rows*l.Cols), e/l.Cols%l.Rows, e%l.Cols
	return (o*(l.Rows/l.TileH)+row/l.TileH)*(l.Cols/l.TileW) + col/l.TileW, row % l.TileH, col % l.TileW
}

// tileNorms is the L2 norm of every tile of every tensor of ts.
func tileNorms(ls []distro.TileLayout, ts [][]float32) [][]float64 {
	out := make([][]float64, len(ls))
	for i, l := range ls {
		out[i] = make([]float64, l.Tiles())
		for e, v := range ts[i] {
			t, _, _ := tileOf(l, e)
			out[i][t] += float64(v) * float64(v)
		}
		for t, s := range out[i] {
			out[i][t] = math.Sqrt(s)
		}
	}
	return out
}

// clipScale is what DeMo.Step multiplies a gradient of norm norm by
// (before the DCT) at learning rate lr.
func clipScale(o distro.Options, lr float32, norm float64) float64 {
	if o.ClipGradNorm > 0 && norm > float64(o.ClipGradNorm) {
		return float64(float32(float64(lr) * float64(o.ClipGradNorm) / norm))
	}
	return float64(lr)
}

// choiceCount sums what comparing frames tile by tile found.
type choiceCount struct {
	tiles    int      // tiles compared
	ties     int      // tiles whose choices differ within tau: near-ties
	diverged int      // tiles not compared: a near-tie earlier left the two different residuals
	values   int      // values compared (a 1-bit frame's are signs)
	worst    float64  // the largest |value difference| / tau over them
	tieWorst float64  // the largest gap / tau between coefficients a near-tie swapped
	bad      []string // tiles that differ beyond a near-tie
}

func (c *choiceCount) add(d choiceCount) {
	c.tiles, c.ties, c.diverged, c.values = c.tiles+d.tiles, c.ties+d.ties, c.diverged+d.diverged, c.values+d.values
	c.worst, c.tieWorst = max(c.worst, d.worst), max(c.tieWorst, d.tieWorst)
	c.bad = append(c.bad, d.bad...)
}

func (c choiceCount) String() string {
	s := fmt.Sprintf("%d of %d tiles near-ties (swapped coefficients within %.2g of the bound; %d tiles left out after one)",
		c.ties, c.tiles, c.tieWorst, c.diverged)
	if c.values > 0 {
		s += fmt.Sprintf(", %d values within %.2g of it", c.values, c.worst)
	}
	return s
}

// ratio is d/tol, 0 where both are 0 (a tile of zeros: both sides
// hold exactly 0).
func ratio(d, tol float64) float64 {
	if d == 0 {
		return 0
	}
	return d / tol
}

// reportBad fails t with the first few tiles that differ beyond a
// near-tie and how many there are.
func reportBad(t *testing.T, what string, bad []string) {
	t.Helper()
	for _, b := range bad[:min(len(bad), 5)] {
		t.Errorf("%s: %s", what, b)
	}
	if len(bad) > 5 {
		t.Errorf("%s: %d tiles in all", what, len(bad))
	}
}

// split merges one tile's ascending index lists a and b: the positions
// (in a, in b) of the indices both hold, and those each holds alone.
func split(a, b []uint32) (both [][2]int, onlyA, onlyB []int) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			onlyA = append(onlyA, i)
			i++
		case i == len(a) || b[j] < a[i]:
			onlyB = append(onlyB, j)
			j++
		default:
			both = append(both, [2]int{i, j})
			i, j = i+1, j+1
		}
	}
	return both, onlyA, onlyB
}

// compareFrames compares the choices of two optimizers' unquantized
// frames a and b, tau[i][t] bounding how far their coefficients in tile t
// of tensor i may lie apart. Where both chose a coefficient its values
// differ by at most tau. Where a chose x and b chose y instead, a's |x|
// is at least its |y| and b's |y| at least its |x|, so a's |x| and b's |y|
// lie within tau of each other: if they do not, the tile is no near-tie.
// A sign that differs must belong to a value within tau of zero.
func compareFrames(a, b *distro.Frame, tau [][]float64) choiceCount {
	var c choiceCount
	for i := range a.Tensors {
		ta, tb := &a.Tensors[i], &b.Tensors[i]
		k := ta.K
		for t := 0; t*k < len(ta.Indices); t++ {
			c.tiles++
			lo, hi := t*k, (t+1)*k
			ai, bi, av, bv := ta.Indices[lo:hi], tb.Indices[lo:hi], ta.Values[lo:hi], tb.Values[lo:hi]
			tol := tau[i][t]
			both, onlyA, onlyB := split(ai, bi)
			var why string
			for _, p := range both {
				x, y := float64(av[p[0]]), float64(bv[p[1]])
				c.values++
				c.worst = max(c.worst, ratio(math.Abs(x-y), tol))
				if math.Abs(x-y) > tol {
					why = fmt.Sprintf("coefficient %d is %g and %g, more than %.3g apart", ai[p[0]], x, y, tol)
				}
			}
			for _, p := range onlyA {
				for _, q := range onlyB {
					x, y := math.Abs(float64(av[p])), math.Abs(float64(bv[q]))
					c.tieWorst = max(c.tieWorst, ratio(math.Abs(x-y), tol))
					if math.Abs(x-y) > tol {
						why = fmt.Sprintf("one chose coefficient %d (|%g|), the other %d (|%g|) instead: more than %.3g apart, no near-tie",
							ai[p], x, bi[q], y, tol)
					}
				}
			}
			switch {
			case why != "":
				c.bad = append(c.bad, fmt.Sprintf("tensor %d tile %d: %s", i, t, why))
			case len(onlyA) > 0:
				c.ties++
			}
		}
	}
	return c
}

// exactMomentum is DeMo's momentum computed in float64 with exact cosines
// (the DCT from its definition, NormalizeRMS's division unrounded), with,
// per coefficient, a bound (dev) on how far a float32 DeMo's may lie from
// it: the DCT's rounding (dctErr, per transform), carried through the
// division by the coefficient's running RMS plus floor, scaled into the
// momentum, plus the roundings of the products, decayed with the momentum
// and cleared where a step sends the coefficient (both sides then hold 0).
// Two engines are compared through it (compare): each within dev of it,
// they may choose differently only between coefficients whose exact
// magnitudes lie within their devs of each other.
type exactMomentum struct {
	o        distro.Options
	layouts  []distro.TileLayout
	steps    int
	m, dev   [][]float64 // per tensor, tile-major, each tile's coefficients row-major (Go's index)
	v        [][]float64 // NormalizeRMS's running mean squares
	errSq    [][]float64 // NormalizeRMS: per tile, Σ 0.95^(S−s)·e_s², e_s the DCT's error bound at step s
	diverged [][]bool    // tiles a near-tie left with different residuals on the two sides: not compared again
}

// The constants of distro's NormalizeRMS (normBeta, normFloor).
const (
	normBeta  = 0.95
	normFloor = 0.1
)

func newExactMomentum(layouts []distro.TileLayout, o distro.Options) *exactMomentum {
	x := &exactMomentum{o: o, layouts: layouts}
	for _, l := range layouts {
		n := l.Outer * l.Rows * l.Cols
		x.m, x.dev, x.v = append(x.m, make([]float64, n)), append(x.dev, make([]float64, n)), append(x.v, make([]float64, n))
		x.errSq = append(x.errSq, make([]float64, l.Tiles()))
		x.diverged = append(x.diverged, make([]bool, l.Tiles()))
	}
	return x
}

// basis is the orthonormal DCT-II matrix of length n (row k the k-th
// basis vector), exact to float64.
func basis(n int) [][]float64 {
	b := make([][]float64, n)
	for k := range b {
		b[k] = make([]float64, n)
		s := math.Sqrt(2 / float64(n))
		if k == 0 {
			s = math.Sqrt(1 / float64(n))
		}
		for i := range b[k] {
			b[k][i] = s * math.Cos(math.Pi*float64((2*i+1)*k)/float64(2*n))
		}
	}
	return b
}

// step folds a step's gradient at learning rate lr in: the momentum is
// then what both engines held before they chose.
func (x *exactMomentum) step(grads [][]float32, lr float32) {
	x.steps++
	scale := clipScale(x.o, lr, distro.GradNorm(grads))
	beta := float64(x.o.Decay)
	w, unbias := 1-normBeta, 1/(1-math.Pow(normBeta, float64(x.steps)))
	for i, l := range x.layouts {
		th, tw, ts := l.TileH, l.TileW, l.TileH*l.TileW
		tilesR, tilesC := l.Rows/th, l.Cols/tw
		bh, bw := basis(th), basis(tw)
		half, c, delta := make([]float64, ts), make([]float64, ts), make([]float64, ts)
		for t := range l.Tiles() {
			at := (t/(tilesR*tilesC)*l.Rows+t/tilesC%tilesR*th)*l.Cols + t%tilesC*tw
			var norm float64
			for r := range th {
				row := grads[i][at+r*l.Cols : at+r*l.Cols+tw]
				for kw := range tw {
					var s float64
					for col, g := range row {
						s += float64(g) * bw[kw][col]
					}
					half[r*tw+kw] = s
				}
				for _, g := range row {
					norm += float64(g) * float64(g)
				}
			}
			for kh := range th {
				for kw := range tw {
					var s float64
					for r := range th {
						s += bh[kh][r] * half[r*tw+kw]
					}
					c[kh*tw+kw] = s
				}
			}
			e := dctErr(l) / 2 * math.Sqrt(norm) // one float32 DCT's error, per coefficient
			for j := range delta {
				delta[j] = e
			}
			if x.o.NormalizeRMS {
				// c/(sqrt(v·U)+F): c moves by e; sqrt(v) by at most the
				// norm of its terms' moves, sqrt(w·Σβ^(S−s)·e_s²), and F
				// (a tenth of the tile's RMS) by a tenth of that; the
				// float32 division, root and stored v round by a few u.
				v := x.v[i][t*ts : (t+1)*ts]
				var total float64
				for j := range v {
					v[j] = normBeta*v[j] + w*c[j]*c[j]
					total += v[j]
				}
				x.errSq[i][t] = normBeta*x.errSq[i][t] + e*e
				floor := normFloor * math.Sqrt(total/float64(ts)*unbias)
				moved := 1.1 * math.Sqrt(unbias*w*x.errSq[i][t])
				for j := range c {
					if floor == 0 { // the tile is, and has been, zero: both send zeros
						c[j], delta[j] = 0, 0
						continue
					}
					d := math.Sqrt(v[j]*unbias) + floor
					c[j] /= d
					delta[j] = e/d + math.Abs(c[j])*moved/d + 4*unit*math.Abs(c[j])
				}
			}
			m, dev := x.m[i][t*ts:(t+1)*ts], x.dev[i][t*ts:(t+1)*ts]
			for j := range m {
				kept, added := beta*m[j], scale*c[j]
				m[j] = kept + added
				dev[j] = beta*dev[j] + scale*delta[j] + 2*unit*(math.Abs(kept)+math.Abs(added))
			}
		}
	}
}

// compare compares the frames two engines made at this step, a the Go
// engine's and b the torch engine's (the index sets, the signs and,
// unquantized, the values), then clears the coefficients they sent. Each
// engine's value of a coefficient lies within dev of the exact one (a
// sign may differ only where the exact value is within dev of zero).
// Where a chose x and b chose y instead, a's |x| is at least its |y| and
// b's |y| at least its |x|, so the exact |x| and |y| lie within the sum
// of their devs: if they do not, the tile is no near-tie.
func (x *exactMomentum) compare(a, b *distro.Frame) choiceCount {
	var c choiceCount
	for i := range a.Tensors {
		ta, tb := &a.Tensors[i], &b.Tensors[i]
		k, ts := ta.K, ta.TileH*ta.TileW
		for t := 0; t*k < len(ta.Indices); t++ {
			lo, hi := t*k, (t+1)*k
			ai, bi := ta.Indices[lo:hi], tb.Indices[lo:hi]
			m, dev := x.m[i][t*ts:(t+1)*ts], x.dev[i][t*ts:(t+1)*ts]
			if x.diverged[i][t] {
				c.diverged++
			} else {
				c.tiles++
				var why string
				check := func(f *distro.Tensor, at int) {
					j := f.Indices[at]
					got, want, tol := float64(f.Values[at]), m[j], dev[j]
					if f.Quantized {
						if (got < 0) != (want < 0) && math.Abs(want) > tol {
							why = fmt.Sprintf("coefficient %d is %.6g, sent as %g", j, want, got)
						}
						return
					}
					c.values++
					c.worst = max(c.worst, ratio(math.Abs(got-want), tol))
					if math.Abs(got-want) > tol {
						why = fmt.Sprintf("coefficient %d is %.6g, sent as %.6g: more than %.3g off", j, want, got, tol)
					}
				}
				both, onlyA, onlyB := split(ai, bi)
				for _, p := range both {
					check(ta, lo+p[0])
					check(tb, lo+p[1])
				}
				for _, p := range onlyA {
					for _, q := range onlyB {
						xa, xb := math.Abs(m[ai[p]]), math.Abs(m[bi[q]])
						tol := dev[ai[p]] + dev[bi[q]]
						c.tieWorst = max(c.tieWorst, ratio(math.Abs(xa-xb), tol))
						if math.Abs(xa-xb) > tol {
							why = fmt.Sprintf("one chose coefficient %d (%.6g), the other %d (%.6g) instead: more than %.3g apart, no near-tie",
								ai[p], m[ai[p]], bi[q], m[bi[q]], tol)
						}
					}
				}
				switch {
				case why != "":
					c.bad = append(c.bad, fmt.Sprintf("tensor %d tile %d: %s", i, t, why))
				case len(onlyA) > 0:
					c.ties++
					x.diverged[i][t] = true
				}
			}
			for _, j := range ai {
				m[j], dev[j] = 0, 0
			}
		}
	}
	return c
}

// gradientBound is, per tensor and tile, how far two optimizers' first
// momentum (a fresh state's: lr times the clipped gradient's DCT) may lie
// apart when one steps on gradient a and the other on b: the gradients'
// difference in the tile (the DCT keeps norms), the clip scales' difference
// (each from its own gradient's norm), the two DCTs' roundings (dctErr)
// and the roundings of the products.
func gradientBound(layouts []distro.TileLayout, o distro.Options, lr float32, a, b [][]float32) [][]float64 {
	sa, sb := clipScale(o, lr, distro.GradNorm(a)), clipScale(o, lr, distro.GradNorm(b))
	diff := make([][]float32, len(a))
	for i := range a {
		diff[i] = make([]float32, len(a[i]))
		for j := range a[i] {
			diff[i][j] = b[i][j] - a[i][j]
		}
	}
	dn, an := tileNorms(layouts, diff), tileNorms(layouts, a)
	out := make([][]float64, len(layouts))
	for i, l := range layouts {
		out[i] = make([]float64, l.Tiles())
		for t := range out[i] {
			out[i][t] = max(sa, sb)*dn[i][t] + (math.Abs(sa-sb)+max(sa, sb)*(dctErr(l)+4*unit))*an[i][t]
		}
	}
	return out
}
