package kernels

import "sync"

// tiledGemm is C = alpha·op(A)·op(B) + beta·C (row-major, as Host.Gemm) by
// 2×4 register tiles over packed rows: op(A) is copied row by row and op(B)
// column by column into contiguous k-long vectors, so that every element
// of a tile is a dot product of two contiguous runs and the eight sums of
// a tile stay in registers. It is what Go.Gemm uses where gonum has no
// assembly and no threads pay (WebAssembly, the browser trainer): there
// gonum's one-row-at-a-time loops load and store C for every multiply,
// and this does not (2–3× faster under V8; see scripts/test-browser).
func tiledGemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scaleRows(m, n, beta, c, ldc)
		return
	}
	pa, pb := packBuffers.Get().(*[]float32), packBuffers.Get().(*[]float32)
	defer packBuffers.Put(pa)
	defer packBuffers.Put(pb)
	ap := packRows(pa, transA, m, k, a, lda)
	bp := packRows(pb, !transB, n, k, b, ldb)
	// Columns of C in blocks whose packed B stays in cache while every
	// row block of A passes over it.
	colBlock := max(4, min(n, (64<<10)/(4*k))&^3)
	for j0 := 0; j0 < n; j0 += colBlock {
		j1 := min(n, j0+colBlock)
		for i := 0; i < m; i += 2 {
			for j := j0; j < j1; j += 4 {
				if i+2 <= m && j+4 <= j1 {
					tile2x4(k, alpha, ap[i*k:(i+2)*k], bp[j*k:(j+4)*k], beta, c[i*ldc+j:], ldc)
					continue
				}
				for ii := i; ii < min(i+2, m); ii++ {
					for jj := j; jj < min(j+4, j1); jj++ {
						s := dot(ap[ii*k:(ii+1)*k], bp[jj*k:(jj+1)*k])
						setC(&c[ii*ldc+jj], alpha*s, beta)
					}
				}
			}
		}
	}
}

// packBuffers holds the packed copies between products: a step makes
// dozens, and WebAssembly's garbage collector is slow to take them back.
var packBuffers = sync.Pool{New: func() any { return new([]float32) }}

// packRows returns the rows of op(x) (rows×k, op transposes when trans),
// each contiguous, in *buf (grown as needed): x is rows×k with stride ld,
// or k×rows when trans.
func packRows(buf *[]float32, trans bool, rows, k int, x []float32, ld int) []float32 {
	if !trans && ld == k {
		return x[:rows*k] // already packed
	}
	if cap(*buf) < rows*k {
		*buf = make([]float32, rows*k)
	}
	p := (*buf)[:rows*k]
	if !trans {
		for r := range rows {
			copy(p[r*k:(r+1)*k], x[r*ld:r*ld+k])
		}
		return p
	}
	for q := range k {
		row := x[q*ld : q*ld+rows]
		for r, v := range row {
			p[r*k+q] = v
		}
	}
	return p
}

func dot(x, y []float32) float32 {
	var s float32
	y = y[:len(x)]
	for i, v := range x {
		s += v * y[i]
	}
	return s
}

// setC is *c = v + beta·*c, reading *c only when beta is not 0 (C may hold
// NaN from an earlier use, which beta = 0 must overwrite).
func setC(c *float32, v, beta float32) {
	if beta == 0 {
		*c = v
		return
	}
	*c = v + beta**c
}

func scaleRows(m, n int, beta float32, c []float32, ldc int) {
	for i := range m {
		row := c[i*ldc : i*ldc+n]
		for j := range row {
			if beta == 0 {
				row[j] = 0
			} else {
				row[j] *= beta
			}
		}
	}
}

// tile2x4 computes a 2×4 tile of C from two packed rows of op(A) (a) and
// four of op(B)ᵀ (b), each k long. Two by four, not four by four: under
// V8, Go's WebAssembly keeps eight sums and six operands in registers but
// spills sixteen and eight (a 4×4 tile ran at half the speed).
func tile2x4(k int, alpha float32, a, b []float32, beta float32, c []float32, ldc int) {
	a0, a1 := a[0:k], a[k:2*k]
	b0, b1, b2, b3 := b[0:k], b[k:2*k], b[2*k:3*k], b[3*k:4*k]
	// Equal lengths, said so the compiler drops the bounds checks in the
	// loop (each one a compare and branch on WebAssembly).
	a1, b0, b1, b2, b3 = a1[:len(a0)], b0[:len(a0)], b1[:len(a0)], b2[:len(a0)], b3[:len(a0)]
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	for p := range a0 {
		x0, x1 := a0[p], a1[p]
		y0, y1, y2, y3 := b0[p], b1[p], b2[p], b3[p]
		c00 += x0 * y0
		c01 += x0 * y1
		c02 += x0 * y2
		c03 += x0 * y3
		c10 += x1 * y0
		c11 += x1 * y1
		c12 += x1 * y2
		c13 += x1 * y3
	}
	r0, r1 := c[0:4], c[ldc:ldc+4]
	setC(&r0[0], alpha*c00, beta)
	setC(&r0[1], alpha*c01, beta)
	setC(&r0[2], alpha*c02, beta)
	setC(&r0[3], alpha*c03, beta)
	setC(&r1[0], alpha*c10, beta)
	setC(&r1[1], alpha*c11, beta)
	setC(&r1[2], alpha*c12, beta)
	setC(&r1[3], alpha*c13, beta)
}
