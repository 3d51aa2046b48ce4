package distro

import (
	"fmt"
	"sync"
)

// LargestDivisor is the chunk size of a dimension: the largest divisor of n
// that is at most chunk.
func LargestDivisor(n, chunk int) int {
	for d := min(n, chunk); d > 1; d-- {
		if n%d == 0 {
			return d
		}
	}
	return 1
}

// tensorPlan describes how one tensor is cut into tiles. The tensor is viewed
// as outer × rows × cols (a 1-D tensor is 1 × 1 × n); tiles cover th × tw
// blocks of the last two dimensions.
type tensorPlan struct {
	shape             []int
	outer, rows, cols int
	th, tw            int
	tilesR, tilesC    int
	k                 int
	dct               tileTransform
	params            int
}

func newTensorPlan(shape []int, chunk, topk int) (*tensorPlan, error) {
	if len(shape) == 0 || len(shape) > MaxDims {
		return nil, fmt.Errorf("distro: tensor with %d dims", len(shape))
	}
	p := &tensorPlan{shape: append([]int(nil), shape...), outer: 1, rows: 1}
	for i, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("distro: tensor shape %v has a non-positive dimension", shape)
		}
		if i < len(shape)-2 {
			p.outer *= d
		}
	}
	p.cols = shape[len(shape)-1]
	if len(shape) >= 2 {
		p.rows = shape[len(shape)-2]
	}
	p.th, p.tw = LargestDivisor(p.rows, chunk), LargestDivisor(p.cols, chunk)
	p.tilesR, p.tilesC = p.rows/p.th, p.cols/p.tw
	p.k = min(topk, p.th*p.tw)
	p.params = p.outer * p.rows * p.cols
	p.dct = newDCT2(p.th, p.tw)
	return p, nil
}

func (p *tensorPlan) tiles() int    { return p.outer * p.tilesR * p.tilesC }
func (p *tensorPlan) tileSize() int { return p.th * p.tw }

// origin returns the offset in the tensor of the first element of tile t.
func (p *tensorPlan) origin(t int) int {
	tc := t % p.tilesC
	t /= p.tilesC
	tr := t % p.tilesR
	o := t / p.tilesR
	return (o*p.rows+tr*p.th)*p.cols + tc*p.tw
}

// gather copies tile t of x into dst (th×tw, row-major).
func (p *tensorPlan) gather(dst, x []float32, t int) {
	at := p.origin(t)
	for i := 0; i < p.th; i++ {
		copy(dst[i*p.tw:(i+1)*p.tw], x[at+i*p.cols:at+i*p.cols+p.tw])
	}
}

// matches reports whether a received tensor was cut the way this plan cuts.
func (p *tensorPlan) matches(t *Tensor) error {
	if len(t.Shape) != len(p.shape) {
		return fmt.Errorf("%w: shape %v, want %v", ErrMismatch, t.Shape, p.shape)
	}
	for i := range t.Shape {
		if t.Shape[i] != p.shape[i] {
			return fmt.Errorf("%w: shape %v, want %v", ErrMismatch, t.Shape, p.shape)
		}
	}
	if t.TileH != p.th || t.TileW != p.tw || t.K != p.k {
		return fmt.Errorf("%w: tiles %dx%d k=%d, want %dx%d k=%d", ErrMismatch, t.TileH, t.TileW, t.K, p.th, p.tw, p.k)
	}
	if len(t.Indices) != p.tiles()*p.k || len(t.Values) != len(t.Indices) {
		return fmt.Errorf("%w: %d entries, want %d", ErrMismatch, len(t.Indices), p.tiles()*p.k)
	}
	return nil
}

// parallel runs fn over [0, n) split into contiguous ranges, one per worker.
// Each range is processed by one goroutine with its own scratch, so results
// do not depend on the number of workers.
func parallel(workers, n int, fn func(lo, hi int)) {
	workers = max(1, min(workers, n))
	if workers == 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		lo, hi := n*w/workers, n*(w+1)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// tileTransform is the 2-D DCT of one tile and its inverse; tmp is scratch of
// the tile's size. (An interface so that the benchmarks can swap in the
// naive baseline and measure it inside the very same Step.)
type tileTransform interface {
	forward(tile, tmp []float32)
	inverse(tile, tmp []float32)
}
