package distro

import "math"

// The DCT used here is the orthonormal DCT-II (and its inverse, the
// orthonormal DCT-III) along each of the two dimensions of a tile.
//
// Along one dimension of length n, the unnormalized DCT-II is
//
//	X[k] = Σ_i x[i]·cos(π(2i+1)k / 2n)
//
// and the orthonormal transform scales X[0] by √(1/n) and the others by √(2/n).
// Because the orthonormal matrix is orthogonal, its inverse is its transpose:
// scale, then apply the transpose of the unnormalized transform.
//
// The unnormalized transform is computed with Lee's decimation (B. G. Lee,
// 1984), which splits an even length n into two transforms of length n/2:
//
//	u[i] = x[i] + x[n−1−i]
//	v[i] = (x[i] − x[n−1−i]) · 1/(2·cos(π(2i+1)/2n))        i < n/2
//	X[2k] = U[k],  X[2k+1] = V[k] + V[k+1]  (V[n/2] = 0)
//
// where U and V are the length-n/2 transforms of u and v. An odd length is
// computed directly from a cosine table. The transpose runs the same flow
// graph backwards, which is exact and as stable as the forward direction.
//
// Every operation works on whole rows of a tile ("lanes"): the transform along
// the rows of an h×w tile combines rows with w-wide vector operations, so the
// inner loops run over contiguous memory.

// dct1 is a plan for the transform of length n.
//
// To avoid moving rows around, the forward transform leaves its coefficients
// in a permuted row order (row r holds coefficient perm[r]), and the
// transpose takes its input in that same order; the 2-D driver reads and
// writes through the permutation while it transposes the tile, which it does
// anyway. Each call ping-pongs between two buffers and returns the one that
// holds the result.
type dct1 struct {
	n    int
	g    []float32 // even n: 1/(2cos(π(2i+1)/2n)), i < n/2
	half *dct1     // even n: the plan for n/2
	cos  []float32 // odd n > 1: cos(π(2i+1)k/2n) at [k*n+i]
	perm []int     // row r of a forward result holds coefficient perm[r]
	inv  []int     // coefficient k is in row inv[k]
}

func newDCT1(n int) *dct1 {
	p := &dct1{n: n, perm: make([]int, n), inv: make([]int, n)}
	switch {
	case n == 1:
	case n%2 == 0:
		h := n / 2
		p.g = make([]float32, h)
		for i := range p.g {
			p.g[i] = float32(1 / (2 * math.Cos(math.Pi*float64(2*i+1)/float64(2*n))))
		}
		p.half = newDCT1(h)
		for r, k := range p.half.perm {
			p.perm[r] = 2 * k     // the u half holds the even coefficients
			p.perm[h+r] = 2*k + 1 // the v half the odd ones
		}
	default:
		p.cos = make([]float32, n*n)
		for k := 0; k < n; k++ {
			for i := 0; i < n; i++ {
				p.cos[k*n+i] = float32(math.Cos(math.Pi * float64((2*i+1)*k) / float64(2*n)))
			}
		}
	}
	if n%2 == 1 {
		for r := range p.perm {
			p.perm[r] = r
		}
	}
	for r, k := range p.perm {
		p.inv[k] = r
	}
	return p
}

// forward computes the unnormalized DCT-II along the row index of the n rows
// (each l wide) in a, using b as scratch. It returns a or b, whichever holds
// the result, in permuted row order.
func (p *dct1) forward(a, b []float32, l int) []float32 {
	n := p.n
	switch {
	case n == 1:
		return a
	case p.cos != nil:
		p.direct(b, a, l, false)
		return b
	}
	h := n / 2
	for i := 0; i < h; i++ {
		butterfly(b[i*l:(i+1)*l], b[(h+i)*l:(h+i+1)*l], a[i*l:(i+1)*l], a[(n-1-i)*l:(n-i)*l], p.g[i])
	}
	u := p.half.forward(b[:h*l], a[:h*l], l)
	p.half.forward(b[h*l:n*l], a[h*l:n*l], l) // lands on the same side as u
	res := a
	if &u[0] == &b[0] {
		res = b
	}
	// X[2k+1] = V[k] + V[k+1]: in place, in increasing k, so V[k+1] is
	// still the original when it is read.
	v := res[h*l : n*l]
	inv := p.half.inv
	for k := 0; k+1 < h; k++ {
		row, next := v[inv[k]*l:(inv[k]+1)*l], v[inv[k+1]*l:(inv[k+1]+1)*l]
		add(row, row, next)
	}
	return res
}

// transpose applies the transpose of the unnormalized DCT-II (an unnormalized
// DCT-III) along the row index of a, whose rows are in the permuted order a
// forward result has. It returns a or b, whichever holds the result, in
// natural order.
func (p *dct1) transpose(a, b []float32, l int) []float32 {
	n := p.n
	switch {
	case n == 1:
		return a
	case p.cos != nil:
		p.direct(b, a, l, true)
		return b
	}
	h := n / 2
	// The first half of a already is U' = Z[2k] (in the half's order). The
	// second half becomes V'[k] = Z[2k+1] + Z[2k−1], in place, in decreasing
	// k so that Z[2k−1] is still the original.
	v := a[h*l : n*l]
	inv := p.half.inv
	for k := h - 1; k >= 1; k-- {
		row, prev := v[inv[k]*l:(inv[k]+1)*l], v[inv[k-1]*l:(inv[k-1]+1)*l]
		add(row, row, prev)
	}
	u := p.half.transpose(a[:h*l], b[:h*l], l)
	p.half.transpose(a[h*l:n*l], b[h*l:n*l], l)
	src, dst := a, b
	if &u[0] == &b[0] {
		src, dst = b, a
	}
	for i := 0; i < h; i++ {
		unbutterfly(dst[i*l:(i+1)*l], dst[(n-1-i)*l:(n-i)*l], src[i*l:(i+1)*l], src[(h+i)*l:(h+i+1)*l], p.g[i])
	}
	return dst
}

// direct is the O(n²) transform for odd lengths (or its transpose), from x
// into out.
func (p *dct1) direct(out, x []float32, l int, transposed bool) {
	n := p.n
	clear(out[:n*l])
	for k := 0; k < n; k++ {
		row := out[k*l : (k+1)*l]
		for i := 0; i < n; i++ {
			c := p.cos[k*n+i]
			if transposed {
				c = p.cos[i*n+k]
			}
			axpy(row, c, x[i*l:(i+1)*l])
		}
	}
}

// orthoScale returns the orthonormal scale of each coefficient of length n.
func orthoScale(n int) []float32 {
	s := make([]float32, n)
	for k := range s {
		if k == 0 {
			s[k] = float32(math.Sqrt(1 / float64(n)))
		} else {
			s[k] = float32(math.Sqrt(2 / float64(n)))
		}
	}
	return s
}

// dct2 is a plan for the orthonormal 2-D DCT of an h×w tile (row-major).
type dct2 struct {
	h, w   int
	rows   *dct1 // length h, applied along the row index
	cols   *dct1 // length w, applied (after a transpose) along the column index
	sh, sw []float32
}

func newDCT2(h, w int) *dct2 {
	return &dct2{h: h, w: w, rows: newDCT1(h), cols: newDCT1(w), sh: orthoScale(h), sw: orthoScale(w)}
}

// forward turns the tile into its coefficients (row-major, [kh][kw]). tmp is
// scratch of the tile's size.
func (p *dct2) forward(tile, tmp []float32) {
	h, w := p.h, p.w
	r := p.rows.forward(tile, tmp, w) // h rows in permuted order
	t := tile
	if &r[0] == &tile[0] {
		t = tmp
	}
	// Transpose to w×h, reading row kh from where the permutation put it.
	for kh := 0; kh < h; kh++ {
		src := r[p.rows.inv[kh]*w : (p.rows.inv[kh]+1)*w]
		for j, v := range src {
			t[j*h+kh] = v
		}
	}
	c := p.cols.forward(t, r, h) // w rows (column coefficients) in permuted order
	out := tile
	if &c[0] == &tile[0] {
		out = tmp
	}
	for kw := 0; kw < w; kw++ {
		s := p.sw[kw]
		src := c[p.cols.inv[kw]*h : (p.cols.inv[kw]+1)*h]
		for kh, v := range src {
			out[kh*w+kw] = v * s * p.sh[kh]
		}
	}
	if &out[0] != &tile[0] {
		copy(tile, out)
	}
}

// inverse turns coefficients back into the tile.
func (p *dct2) inverse(tile, tmp []float32) {
	h, w := p.h, p.w
	// Scale and transpose to w×h with the column coefficients in the order
	// the column transform's transpose expects.
	for r, kw := range p.cols.perm {
		s := p.sw[kw]
		dst := tmp[r*h : (r+1)*h]
		for kh := range dst {
			dst[kh] = tile[kh*w+kw] * s * p.sh[kh]
		}
	}
	c := p.cols.transpose(tmp, tile, h) // w rows (spatial columns), natural order
	t := tile
	if &c[0] == &tile[0] {
		t = tmp
	}
	for r, kh := range p.rows.perm {
		dst := t[r*w : (r+1)*w]
		for j := range dst {
			dst[j] = c[j*h+kh]
		}
	}
	if res := p.rows.transpose(t, c, w); &res[0] != &tile[0] {
		copy(tile, res)
	}
}

// transpose writes the r×c matrix src into dst as c×r.
func transpose(dst, src []float32, r, c int) {
	const b = 16
	for i0 := 0; i0 < r; i0 += b {
		for j0 := 0; j0 < c; j0 += b {
			for i := i0; i < min(i0+b, r); i++ {
				row := src[i*c : (i+1)*c]
				for j := j0; j < min(j0+b, c); j++ {
					dst[j*r+i] = row[j]
				}
			}
		}
	}
}
