package distro

import "fmt"

// Sizes a run's results may have, derived from the run's model: a peer's
// frame is checked against these before anything is allocated for it, so
// that a frame or blob declared bigger than any honest one is refused
// without reading it (DefaultLimits allow 1 GiB; a small model's frames are
// kilobytes).

// Limits are the decoder limits of this model's frames: its tensors, its
// parameters and exactly tiles×k entries per tensor.
func (pl *Plan) Limits() Limits {
	lim := Limits{MaxTensors: len(pl.plans), MaxLosses: MaxLosses}
	for _, p := range pl.plans {
		lim.MaxParams += int64(p.tiles() * p.tileSize())
		lim.MaxEntries += int64(p.tiles() * p.k)
	}
	return lim
}

// MaxFrameBytes is the size of the largest frame this model's results can
// encode to (fixed-width or Rice-coded indices, whichever is larger, float or
// 1-bit values as the run says, and a loss for each of up to MaxLosses
// sequences): no honest blob is larger.
func (pl *Plan) MaxFrameBytes() int64 {
	n := int64(8) // magic, version, frame flags, tensor count
	n += int64(lossesBytes(MaxLosses))
	for _, p := range pl.plans {
		// ndim and flags, then tile height, tile width, k and the dims as
		// varints of at most 5 bytes each.
		n += 2 + 5*int64(3+len(p.shape))
		entries := int64(p.tiles() * p.k)
		fixed := entries * int64(indexWidth(p.tileSize()))
		// Rice: a tile's gaps sum to at most tileSize−k, so their
		// quotients to at most (tileSize−k)>>r bits, plus 1+r bits per
		// entry.
		r := int64(riceParam(p.tileSize(), p.k))
		riceBits := int64(p.tiles()) * (int64(p.tileSize()-p.k)>>r + int64(p.k)*(1+r))
		n += max(fixed, (riceBits+7)/8)
		if pl.opts.Quantize1Bit {
			n += (entries + 7) / 8
		} else {
			n += 4 * entries
		}
	}
	return n
}

// checkQuantization refuses a frame whose values are not what the run
// sends: a 1-bit run accepts only sign frames (a float frame would let one
// peer carry any magnitude into the aggregate), a float run only floats.
func (p *Plan) checkQuantization(f *Frame) error {
	for i := range f.Tensors {
		if f.Tensors[i].Quantized != p.opts.Quantize1Bit {
			return fmt.Errorf("%w: tensor %d: quantized = %v, the run sends quantized = %v",
				ErrMismatch, i, f.Tensors[i].Quantized, p.opts.Quantize1Bit)
		}
	}
	return nil
}

// FrameBounds are Limits and MaxFrameBytes for a model of these shapes,
// without allocating its optimizer state.
func FrameBounds(shapes [][]int, o Options) (Limits, int64, error) {
	p, err := newPlan(shapes, o)
	if err != nil {
		return Limits{}, 0, err
	}
	return p.Limits(), p.MaxFrameBytes(), nil
}
