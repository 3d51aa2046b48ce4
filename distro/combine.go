package distro

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Combined is a round's aggregate before the inverse DCT: for every tensor
// and tile, the coefficients to which the run's aggregation rule gives a
// value. An engine that keeps the parameters elsewhere scatters them into
// zero tiles, inverts the DCT, takes the sign and updates the parameters
// (θ ← θ·Keep(lr) − lr·sign), which is Apply; every decision of the rule
// (the canonical order, the dissenters left out, clipping, trimming, votes,
// duplicate indices) was made by Combine. Its size is that of the frames'
// entries, never of the parameters.
type Combined struct {
	Tensors []CombinedTensor
}

// CombinedTensor holds one tensor's combined coefficients, sorted by tile
// then index, each (tile, index) once, zero values left out. Tiles are
// numbered as TileLayout says; Index is within the tile, row-major.
type CombinedTensor struct {
	Tiles  []uint32
	Index  []uint32
	Values []float32
}

// Entries is the number of coefficients of the tensor.
func (c *CombinedTensor) Entries() int { return len(c.Values) }

// Combine returns the round's aggregate of frames (in any order) before the
// inverse DCT, after the checks, the canonical order and the removal of
// dissenters that Apply makes: scattering it into zero tiles, then the
// inverse DCT, the sign and θ·Keep(lr) − lr·sign gives Apply's parameters
// bit for bit. It refuses a run whose update rule is not UpdateSign (the
// others are experiments of Apply alone).
func (p *Plan) Combine(frames []*Frame) (*Combined, error) {
	if p.opts.Update != UpdateSign {
		return nil, fmt.Errorf("distro: Combine supports only the %s update rule, the run's is %s", UpdateSign, p.opts.Update)
	}
	frames, err := p.roundFrames(frames)
	if err != nil {
		return nil, err
	}
	out := &Combined{Tensors: make([]CombinedTensor, len(p.plans))}
	if len(frames) == 0 {
		return out, nil
	}
	for i, tp := range p.plans {
		ts, n := tp.tileSize(), tp.tiles()
		parts := make([]CombinedTensor, max(1, min(p.opts.Workers, n)))
		parallelParts(len(parts), n, func(part, lo, hi int) {
			tile := make([]float32, ts)
			c := newCombiner(p.opts, ts, tp.k, len(frames))
			// About k distinct indices per tile in a round whose peers
			// agree; it grows if they do not.
			size := (hi - lo) * tp.k
			ct := CombinedTensor{Tiles: make([]uint32, 0, size), Index: make([]uint32, 0, size), Values: make([]float32, 0, size)}
			for t := lo; t < hi; t++ {
				c.tile(tile, frames, i, t)
				// c.touched lists every index the tile's values are at;
				// tile is zero elsewhere, and is left all zero again.
				slices.Sort(c.touched)
				for _, ix := range c.touched {
					if v := tile[ix]; v != 0 {
						ct.Tiles = append(ct.Tiles, uint32(t))
						ct.Index = append(ct.Index, ix)
						ct.Values = append(ct.Values, v)
					}
					tile[ix] = 0
				}
			}
			parts[part] = ct
		})
		if len(parts) == 1 {
			out.Tensors[i] = parts[0]
			continue
		}
		var total int
		for _, pt := range parts {
			total += len(pt.Values)
		}
		ct := CombinedTensor{Tiles: make([]uint32, 0, total), Index: make([]uint32, 0, total), Values: make([]float32, 0, total)}
		for _, pt := range parts {
			ct.Tiles = append(ct.Tiles, pt.Tiles...)
			ct.Index = append(ct.Index, pt.Index...)
			ct.Values = append(ct.Values, pt.Values...)
		}
		out.Tensors[i] = ct
	}
	return out, nil
}

// ApplyCombined updates params with a round's aggregate as Combine made
// it: each tile's coefficients scattered into a zero tile, the inverse DCT,
// the sign, and θ·Keep(lr) − lr·sign. It is the one apply every engine
// makes (the Go engine here, the PyTorch worker on its device); with
// Combine before it, it gives Apply's parameters bit for bit. A tile the
// aggregate leaves empty only decays (its sign is 0 everywhere), with no
// transform. It refuses an aggregate that does not fit the plan (a tile or
// index outside its tensor, entries out of order or repeated), so no engine
// trusts its input's shape.
func (p *Plan) ApplyCombined(params [][]float32, c *Combined, lr float32) error {
	if err := p.checkTensors("parameter", params); err != nil {
		return err
	}
	if err := p.CheckCombined(c); err != nil {
		return err
	}
	keep := p.Keep(lr)
	for i, tp := range p.plans {
		ct, ts, out := &c.Tensors[i], tp.tileSize(), params[i]
		parallel(p.opts.Workers, tp.tiles(), func(lo, hi int) {
			tile, tmp := make([]float32, ts), make([]float32, ts)
			// this range's first entry: Tiles is sorted
			j, _ := slices.BinarySearch(ct.Tiles, uint32(lo))
			for t := lo; t < hi; t++ {
				at := tp.origin(t)
				if j == len(ct.Tiles) || ct.Tiles[j] != uint32(t) {
					for r := range tp.th {
						row := out[at+r*tp.cols : at+r*tp.cols+tp.tw]
						for x := range row {
							row[x] = float32(row[x] * keep)
						}
					}
					continue
				}
				clear(tile)
				for ; j < len(ct.Tiles) && ct.Tiles[j] == uint32(t); j++ {
					tile[ct.Index[j]] = ct.Values[j]
				}
				tp.dct.inverse(tile, tmp)
				signs(tile)
				for r := range tp.th {
					row := out[at+r*tp.cols : at+r*tp.cols+tp.tw]
					for x, s := range tile[r*tp.tw : (r+1)*tp.tw] {
						// θ·keep rounded before the subtraction (Plan.Keep)
						row[x] = float32(row[x]*keep) - lr*s
					}
				}
			}
		})
	}
	return nil
}

// CheckCombined refuses an aggregate that is not one of this plan's: an
// engine that applies it elsewhere checks it with this first.
func (p *Plan) CheckCombined(c *Combined) error {
	if c == nil || len(c.Tensors) != len(p.plans) {
		n := 0
		if c != nil {
			n = len(c.Tensors)
		}
		return fmt.Errorf("distro: an aggregate of %d tensors, the model has %d", n, len(p.plans))
	}
	for i, tp := range p.plans {
		ct := &c.Tensors[i]
		if len(ct.Tiles) != len(ct.Values) || len(ct.Index) != len(ct.Values) {
			return fmt.Errorf("distro: aggregate tensor %d: %d tiles, %d indices, %d values", i, len(ct.Tiles), len(ct.Index), len(ct.Values))
		}
		tiles, ts := uint32(tp.tiles()), uint32(tp.tileSize())
		for j := range ct.Values {
			tile, ix := ct.Tiles[j], ct.Index[j]
			if tile >= tiles || ix >= ts {
				return fmt.Errorf("distro: aggregate tensor %d: entry %d at tile %d index %d, outside %d tiles of %d", i, j, tile, ix, tiles, ts)
			}
			if j > 0 && (tile < ct.Tiles[j-1] || tile == ct.Tiles[j-1] && ix <= ct.Index[j-1]) {
				return fmt.Errorf("distro: aggregate tensor %d: entry %d (tile %d index %d) not after the one before", i, j, tile, ix)
			}
		}
	}
	return nil
}

// parallelParts is parallel with the number of each range passed on.
func parallelParts(parts, n int, fn func(part, lo, hi int)) {
	if parts <= 1 {
		fn(0, 0, n)
		return
	}
	done := make(chan struct{})
	for w := 0; w < parts; w++ {
		go func() {
			fn(w, n*w/parts, n*(w+1)/parts)
			done <- struct{}{}
		}()
	}
	for range parts {
		<-done
	}
}

// FrameOf builds the frame Step would emit from each tensor's top-k
// coefficients computed elsewhere: indices[i] and values[i] hold k entries
// per tile of tensor i (tile after tile, as TileLayout numbers them), each
// index within its tile. Within a tile the entries may come in any order:
// they are put in ascending index order, the order Step emits (and the
// frame format requires). An index outside its tile, one sent twice in a
// tile, a value that is not finite (ErrNonFinite), a value beyond
// ±MaxValue (the engine must clamp as Step does) and, in 1-bit runs, a
// value other than ±1 are refused. The frame's values and indices are
// copies; it carries no losses.
func (p *Plan) FrameOf(indices [][]uint32, values [][]float32) (*Frame, error) {
	if len(indices) != len(p.plans) || len(values) != len(p.plans) {
		return nil, fmt.Errorf("distro: %d index and %d value tensors, the model has %d", len(indices), len(values), len(p.plans))
	}
	f := &Frame{Tensors: make([]Tensor, len(p.plans))}
	var pairs []indexValue
	for i, tp := range p.plans {
		k, ts := tp.k, tp.tileSize()
		n := tp.tiles() * k
		if len(indices[i]) != n || len(values[i]) != n {
			return nil, fmt.Errorf("distro: tensor %d has %d indices and %d values, want %d (%d tiles of %d)", i, len(indices[i]), len(values[i]), n, tp.tiles(), k)
		}
		t := Tensor{Shape: append([]int(nil), tp.shape...), TileH: tp.th, TileW: tp.tw, K: k,
			Quantized: p.opts.Quantize1Bit, RiceIndices: p.opts.RiceIndices,
			Indices: slices.Clone(indices[i]), Values: slices.Clone(values[i])}
		for j, v := range t.Values {
			if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
				return nil, fmt.Errorf("%w: tensor %d: value %v", ErrNonFinite, i, v)
			}
			if v > MaxValue || v < -MaxValue {
				return nil, fmt.Errorf("distro: tensor %d: value %v at %d beyond ±2^40 (distro.MaxValue): the engine must clamp what it sends", i, v, j)
			}
			if t.Quantized && v != 1 && v != -1 {
				return nil, fmt.Errorf("distro: tensor %d: value %v at %d of a 1-bit run is not ±1", i, v, j)
			}
		}
		for start := 0; start < n; start += k {
			idx, vals := t.Indices[start:start+k], t.Values[start:start+k]
			for _, ix := range idx {
				if int(ix) >= ts {
					return nil, fmt.Errorf("distro: tensor %d: index %d outside a tile of %d", i, ix, ts)
				}
			}
			if !ascending(idx) {
				pairs = pairs[:0]
				for j, ix := range idx {
					pairs = append(pairs, indexValue{ix, vals[j]})
				}
				slices.SortFunc(pairs, func(a, b indexValue) int { return cmp.Compare(a.ix, b.ix) })
				for j, pv := range pairs {
					idx[j], vals[j] = pv.ix, pv.v
				}
				if !ascending(idx) {
					return nil, fmt.Errorf("distro: tensor %d: tile %d sends an index twice", i, start/k)
				}
			}
		}
		f.Tensors[i] = t
	}
	return f, nil
}

type indexValue struct {
	ix uint32
	v  float32
}

func ascending(idx []uint32) bool {
	for j := 1; j < len(idx); j++ {
		if idx[j] <= idx[j-1] {
			return false
		}
	}
	return true
}
