package distro

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// A frame is one trainer's compressed result for one step: for every
// parameter tensor, the top-k DCT coefficients of every tile.
//
// Wire format (little-endian):
//
//	offset  size  field
//	0       4     magic "PSDF"
//	4       1     version (FrameVersion)
//	5       1     frame flags: bit 0 = sequence losses follow the
//	              tensors; other bits 0
//	6       2     tensor count
//	8       ...   tensors, each:
//	        1     ndim (1..MaxDims)
//	        1     flags: bit 0 = values are 1-bit signs; bit 1 = indices
//	              Rice-coded; other bits 0
//	        var   tile height (divides dim[-2], 1 for 1-D tensors)
//	        var   tile width (divides dim[-1])
//	        var   k, entries per tile (1..tile height × tile width)
//	        var×ndim dims
//
//	        (var: unsigned LEB128 varint, minimal length, value < 2^32 —
//	        small models have dozens of small tensors, and fixed 32-bit
//	        fields made the headers half of their frames)
//	        indices: k per tile, tile-local, strictly ascending within a
//	              tile, each 1, 2 or 4 bytes for tiles of ≤ 2^8, ≤ 2^16 or more
//	              coefficients; with flag bit 1, Golomb–Rice codes of the
//	              gaps instead (below), one bit stream for the tensor packed
//	              LSB first, the last byte's spare bits 0
//	        values: k per tile, float32 within ±MaxValue, or with flag bit
//	              0 one bit per entry packed LSB first (1 = +1, 0 = −1), the
//	              last byte's spare bits 0
//
//	then, with frame flag bit 0:
//	        var   sequence count (1..MaxLosses)
//	        4×n   float32 losses, finite and ≥ 0
//
// Tiles are ordered by leading dims, then tile row, then tile column. The
// format is canonical: a decoded frame re-encodes to the same bytes.
//
// Rice-coded indices (an extension of the fixed widths of docs/architecture.md §6; every
// decoder reads both, each sender chooses). A tile's k ascending indices
// i_1 < … < i_k are sent as the gaps d_1 = i_1 and d_j = i_j − i_{j−1} − 1
// (all ≥ 0), each as a Rice code with parameter r: the quotient d >> r in
// unary (that many 1 bits, then a 0), then the low r bits of d, least
// significant first. The k indices of a tile of n coefficients are spread
// over it, so a gap is about n/k; r is derived from n and k alone
// (riceParam), never sent, which keeps the encoding canonical. At chunk 64
// and top-k 16 an index costs about 10 bits instead of 16.

const (
	FrameVersion = 2
	MaxDims      = 8
	frameMagic   = "PSDF"
)

// MaxValue bounds a float frame's values: a value beyond ±MaxValue makes
// the frame malformed (ErrFrame), so its sender is refused like any liar,
// and Step clamps what it sends to the bound (the excess stays in its
// residual), so no honest frame exceeds it whatever the run's settings. A
// bound the decoder checks, rather than arithmetic that tolerates anything
// finite, keeps the aggregation's arithmetic (and the torch worker's, which
// must match it bit for bit) as it is, and names a value no honest trainer
// sends as what it is.
//
// It is far above any honest value. A value is a top-k coefficient of the
// momentum δ ← β·δ + s·c (s ≤ lr, the step's rate). With NormalizeRMS each
// coefficient c is divided by at least the root of its own running mean
// square, which holds (1 − normBeta)·c² (the bias correction is ≥ 1), so
// the normalized coefficient is at most √20 ≈ 4.47; with a gradient clip,
// s·|c| ≤ lr·clip (a coefficient is at most the gradient's L2 norm).
// Sending never enlarges an entry, so |δ| ≤ lr·4.47/(1 − β): at lr 1 (far
// above a run's) and decay 0.999, 4,472 ≈ 2^12, about 2^28 below the
// bound. A run with neither normalization nor clip has no bound of its
// own: there the clamp acts, if ever. (TestHonestValuesWithinTheirBound
// reaches these bounds.)
//
// And no arithmetic on bounded values overflows float32 (its maximum is
// just below 2^128), for any number of frames n and the largest tiles the
// format allows (ts ≤ 2^47 coefficients; a run's chunk ≤ 65,535 gives
// ts < 2^32):
//   - Combine: the mean sums an index's ≤ n values in float32, ≤ n·2^40
//     (< 2^56 for 2^16 frames; a round has at most 256), the other rules
//     in float64. Every rule's result is an average of (clipped) values or
//     a vote, so |combined| ≤ 2^40: the bound is a power of two, so the
//     float32 partial sums j·2^40 round to themselves and the mean's
//     quotient cannot round above it.
//   - The inverse DCT of a tile of ts combined coefficients: whatever
//     either engine computes on the way (Go's butterflies, torch's matrix
//     products) is, but for rounding, at most the sum of the magnitudes of
//     the terms it gathers, at most ts coefficients times basis values ≤
//     1: ≤ ts·2^40 ≤ 2^87 (2^72 for a run's tiles). The orthonormal output
//     is at most √ts·2^40 (its L2 norm is the coefficients').
//   - The update: θ·keep − lr·sign is finite for finite θ; UpdateRMS sums
//     its squares in float64; UpdateAdam squares the decoded value in
//     float32, ≤ ts·2^80 < 2^112 for a run's tiles.
//
// TestBoundedFramesStayFinite runs 256 frames at the bound, and tiles of
// up to 2^15 coefficients all at it, through every rule.
const MaxValue = 1 << 40

var (
	ErrFrame      = errors.New("distro: malformed frame")
	ErrFrameLimit = errors.New("distro: frame exceeds the configured limits")
	ErrMismatch   = errors.New("distro: frame does not match the model")
)

// Tensor is the compressed form of one parameter tensor.
type Tensor struct {
	Shape        []int
	TileH, TileW int
	K            int // entries per tile
	Quantized    bool
	RiceIndices  bool      // indices sent as Rice codes of their gaps
	Indices      []uint32  // K per tile, tile-local, ascending within a tile
	Values       []float32 // K per tile; ±1 when Quantized
}

// Frame is one trainer's result.
type Frame struct {
	Tensors []Tensor
	// Losses, when set, are the trainer's loss (mean cross-entropy over the
	// sequence's positions) on each sequence of its batch, in batch order,
	// on the model it trained on: what it claims to have seen. Witnesses
	// that recompute a few of them on the same model catch a trainer that
	// did not run its assignment (trainer/node). Aggregation ignores them,
	// and so does Fingerprint.
	Losses []float32
}

// MaxLosses is the most sequence losses a frame may carry: a trainer's
// batch is part of a round's, which is at most 65,535 sequences.
const MaxLosses = 1<<16 - 1

// lossesBytes is the encoded size of n losses (none: 0).
func lossesBytes(n int) int {
	if n == 0 {
		return 0
	}
	return uvarintLen(uint64(n)) + 4*n
}

// Limits bounds what a decoder will allocate for one frame.
type Limits struct {
	MaxTensors int   // tensors per frame
	MaxParams  int64 // parameters described, summed over tensors
	MaxEntries int64 // coefficients carried, summed over tensors
	MaxLosses  int   // sequence losses (at most MaxLosses)
}

// DefaultLimits allow models up to 2^31 parameters and 2^27 entries (about
// 1 GiB once decoded).
var DefaultLimits = Limits{MaxTensors: 4096, MaxParams: 1 << 31, MaxEntries: 1 << 27, MaxLosses: MaxLosses}

func indexWidth(tileSize int) int {
	switch {
	case tileSize <= 1<<8:
		return 1
	case tileSize <= 1<<16:
		return 2
	}
	return 4
}

// indexBytes is the encoded size of a tensor's indices.
func indexBytes(t *Tensor) int {
	if !t.RiceIndices {
		return len(t.Indices) * indexWidth(t.TileH*t.TileW)
	}
	r := riceParam(t.TileH*t.TileW, t.K)
	var n int64
	forGaps(t, func(d uint32) { n += int64(d>>r) + 1 + int64(r) })
	return int((n + 7) / 8)
}

// riceParam is the Rice parameter for k indices in tiles of tileSize
// coefficients: about log2 of the mean gap, less one (the best parameter
// for a geometric distribution of mean m is near log2(m·ln 2)).
func riceParam(tileSize, k int) uint {
	return uint(max(0, bits.Len(uint(tileSize/k))-2))
}

// forGaps calls f with every gap of t's indices, tile by tile.
func forGaps(t *Tensor, f func(d uint32)) {
	for start := 0; start+t.K <= len(t.Indices); start += t.K {
		next := uint32(0) // the smallest index the next entry may take
		for _, ix := range t.Indices[start : start+t.K] {
			f(ix - next)
			next = ix + 1
		}
	}
}

// appendRiceIndices appends t's Rice-coded indices (already checked
// ascending).
func appendRiceIndices(b []byte, t *Tensor) []byte {
	r := riceParam(t.TileH*t.TileW, t.K)
	w := bitWriter{b: b}
	forGaps(t, func(d uint32) {
		for q := d >> r; q > 0; q-- {
			w.bit(1)
		}
		w.bit(0)
		for j := uint(0); j < r; j++ {
			w.bit(uint8(d >> j & 1))
		}
	})
	return w.b
}

type bitWriter struct {
	b []byte
	n uint // bits used in the last byte (0: start a new one)
}

func (w *bitWriter) bit(v uint8) {
	if w.n == 0 {
		w.b = append(w.b, 0)
	}
	w.b[len(w.b)-1] |= v << w.n
	w.n = (w.n + 1) % 8
}

// readRiceIndices decodes count Rice-coded indices in tiles of tileSize
// from the front of b and returns them with the number of bytes used. Every
// index must fall inside its tile, and the last byte's spare bits must be 0.
func readRiceIndices(b []byte, count int64, tileSize, k int) ([]uint32, int, error) {
	// At least one bit per index: bound the count before allocating.
	if count > 8*int64(len(b)) {
		return nil, 0, fmt.Errorf("%w: %d indices cannot fit in %d bytes", ErrFrame, count, len(b))
	}
	r := riceParam(tileSize, k)
	out := make([]uint32, count)
	pos, limit := 0, 8*len(b)
	bit := func() (uint32, error) {
		if pos >= limit {
			return 0, fmt.Errorf("%w: index bits truncated", ErrFrame)
		}
		v := uint32(b[pos/8] >> (pos % 8) & 1)
		pos++
		return v, nil
	}
	for start := int64(0); start < count; start += int64(k) {
		next := uint64(0)
		for j := start; j < start+int64(k); j++ {
			var q uint64
			for {
				v, err := bit()
				if err != nil {
					return nil, 0, err
				}
				if v == 0 {
					break
				}
				if q++; q<<r >= uint64(tileSize) {
					return nil, 0, fmt.Errorf("%w: index gap beyond the tile of %d", ErrFrame, tileSize)
				}
			}
			d := q << r
			for i := uint(0); i < r; i++ {
				v, err := bit()
				if err != nil {
					return nil, 0, err
				}
				d |= uint64(v) << i
			}
			ix := next + d
			if ix >= uint64(tileSize) {
				return nil, 0, fmt.Errorf("%w: index %d outside a tile of %d", ErrFrame, ix, tileSize)
			}
			out[j] = uint32(ix)
			next = ix + 1
		}
	}
	used := (pos + 7) / 8
	if pos%8 != 0 && b[used-1]>>(pos%8) != 0 {
		return nil, 0, fmt.Errorf("%w: spare index bits set", ErrFrame)
	}
	return out, used, nil
}

// geometry checks a tensor's shape and tiling and returns its tile count and
// tile size, without trusting any of it.
func geometry(shape []int, th, tw, k int) (tiles, tileSize int64, err error) {
	if len(shape) == 0 || len(shape) > MaxDims {
		return 0, 0, fmt.Errorf("%w: %d dims", ErrFrame, len(shape))
	}
	params := int64(1)
	for _, d := range shape {
		if d <= 0 || d > math.MaxInt32 {
			return 0, 0, fmt.Errorf("%w: dimension %d", ErrFrame, d)
		}
		params *= int64(d)
		if params > math.MaxInt32*int64(1<<16) {
			return 0, 0, fmt.Errorf("%w: tensor too large", ErrFrameLimit)
		}
	}
	rows, cols := 1, shape[len(shape)-1]
	if len(shape) >= 2 {
		rows = shape[len(shape)-2]
	}
	if th <= 0 || tw <= 0 || rows%th != 0 || cols%tw != 0 {
		return 0, 0, fmt.Errorf("%w: tile %dx%d does not divide %dx%d", ErrFrame, th, tw, rows, cols)
	}
	tileSize = int64(th) * int64(tw)
	if k <= 0 || int64(k) > tileSize {
		return 0, 0, fmt.Errorf("%w: k=%d for tiles of %d", ErrFrame, k, tileSize)
	}
	return params / tileSize, tileSize, nil
}

// MarshalBinary encodes the frame. It refuses frames that DecodeFrame would
// reject, so every encoded frame decodes.
func (f *Frame) MarshalBinary() ([]byte, error) {
	if len(f.Tensors) > math.MaxUint16 {
		return nil, fmt.Errorf("%w: %d tensors", ErrFrame, len(f.Tensors))
	}
	if err := checkLosses(f.Losses); err != nil {
		return nil, err
	}
	size := 8 + lossesBytes(len(f.Losses))
	for i := range f.Tensors {
		t := &f.Tensors[i]
		tiles, ts, err := geometry(t.Shape, t.TileH, t.TileW, t.K)
		if err != nil {
			return nil, fmt.Errorf("tensor %d: %w", i, err)
		}
		n := tiles * int64(t.K)
		if int64(len(t.Indices)) != n || int64(len(t.Values)) != n {
			return nil, fmt.Errorf("%w: tensor %d has %d indices and %d values, want %d", ErrFrame, i, len(t.Indices), len(t.Values), n)
		}
		if err := checkEntries(t, int(ts)); err != nil {
			return nil, fmt.Errorf("tensor %d: %w", i, err)
		}
		size += tensorHeaderSize(t) + indexBytes(t)
		if t.Quantized {
			size += int((n + 7) / 8)
		} else {
			size += 4 * int(n)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, frameMagic...)
	var frameFlags byte
	if len(f.Losses) > 0 {
		frameFlags |= 1
	}
	b = append(b, FrameVersion, frameFlags)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(f.Tensors)))
	for i := range f.Tensors {
		t := &f.Tensors[i]
		var flags byte
		if t.Quantized {
			flags |= 1
		}
		if t.RiceIndices {
			flags |= 2
		}
		b = append(b, byte(len(t.Shape)), flags)
		b = binary.AppendUvarint(b, uint64(t.TileH))
		b = binary.AppendUvarint(b, uint64(t.TileW))
		b = binary.AppendUvarint(b, uint64(t.K))
		for _, d := range t.Shape {
			b = binary.AppendUvarint(b, uint64(d))
		}
		switch w := indexWidth(t.TileH * t.TileW); {
		case t.RiceIndices:
			b = appendRiceIndices(b, t)
		case w == 1:
			for _, ix := range t.Indices {
				b = append(b, byte(ix))
			}
		case w == 2:
			for _, ix := range t.Indices {
				b = binary.LittleEndian.AppendUint16(b, uint16(ix))
			}
		default:
			for _, ix := range t.Indices {
				b = binary.LittleEndian.AppendUint32(b, ix)
			}
		}
		if t.Quantized {
			start := len(b)
			b = append(b, make([]byte, (len(t.Values)+7)/8)...)
			for j, v := range t.Values {
				if v > 0 {
					b[start+j/8] |= 1 << (j % 8)
				}
			}
		} else {
			for _, v := range t.Values {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
			}
		}
	}
	if len(f.Losses) > 0 {
		b = binary.AppendUvarint(b, uint64(len(f.Losses)))
		for _, v := range f.Losses {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b, nil
}

// checkLosses refuses more than MaxLosses losses, and losses that no
// cross-entropy has (negative, not finite).
func checkLosses(losses []float32) error {
	if len(losses) > MaxLosses {
		return fmt.Errorf("%w: %d sequence losses, at most %d", ErrFrame, len(losses), MaxLosses)
	}
	for _, v := range losses {
		if !(v >= 0) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: sequence loss %v is not finite and ≥ 0", ErrFrame, v)
		}
	}
	return nil
}

// checkEntries verifies indices (in range, strictly ascending per tile) and
// values (finite and within ±MaxValue; exactly ±1 when quantized).
func checkEntries(t *Tensor, tileSize int) error {
	for start := 0; start < len(t.Indices); start += t.K {
		prev := -1
		for j := start; j < start+t.K; j++ {
			ix := int(t.Indices[j])
			if ix >= tileSize {
				return fmt.Errorf("%w: index %d outside a tile of %d", ErrFrame, ix, tileSize)
			}
			if ix <= prev {
				return fmt.Errorf("%w: indices of a tile are not strictly ascending", ErrFrame)
			}
			prev = ix
		}
	}
	for _, v := range t.Values {
		if t.Quantized {
			if v != 1 && v != -1 {
				return fmt.Errorf("%w: quantized value %v is not ±1", ErrFrame, v)
			}
		} else if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: value %v is not finite", ErrFrame, v)
		} else if v > MaxValue || v < -MaxValue {
			return fmt.Errorf("%w: value %v beyond ±2^40 (distro.MaxValue)", ErrFrame, v)
		}
	}
	return nil
}

type frameReader struct {
	b   []byte
	off int
}

func (r *frameReader) take(n int64) ([]byte, error) {
	if n < 0 || n > int64(len(r.b)-r.off) {
		return nil, fmt.Errorf("%w: truncated at offset %d (need %d bytes)", ErrFrame, r.off, n)
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return s, nil
}

// uvarint reads a minimal unsigned varint below 2^32.
func (r *frameReader) uvarint() (int, error) {
	v, n := binary.Uvarint(r.b[r.off:])
	switch {
	case n == 0:
		return 0, fmt.Errorf("%w: truncated at offset %d", ErrFrame, r.off)
	case n < 0 || v > math.MaxUint32:
		return 0, fmt.Errorf("%w: field at offset %d beyond 32 bits", ErrFrame, r.off)
	case n != uvarintLen(v):
		return 0, fmt.Errorf("%w: field at offset %d not minimally encoded", ErrFrame, r.off)
	}
	r.off += n
	return int(v), nil
}

func uvarintLen(v uint64) int {
	return max(1, (bits.Len64(v)+6)/7)
}

// tensorHeaderSize is the encoded size of a tensor's header.
func tensorHeaderSize(t *Tensor) int {
	n := 2 + uvarintLen(uint64(t.TileH)) + uvarintLen(uint64(t.TileW)) + uvarintLen(uint64(t.K))
	for _, d := range t.Shape {
		n += uvarintLen(uint64(d))
	}
	return n
}

// DecodeFrame parses a frame, rejecting anything malformed or beyond lim
// before allocating for it.
func DecodeFrame(data []byte, lim Limits) (*Frame, error) {
	r := &frameReader{b: data}
	hdr, err := r.take(8)
	if err != nil {
		return nil, err
	}
	if string(hdr[:4]) != frameMagic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrFrame, hdr[:4])
	}
	if hdr[4] != FrameVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrFrame, hdr[4], FrameVersion)
	}
	frameFlags := hdr[5]
	if frameFlags&^1 != 0 {
		return nil, fmt.Errorf("%w: unknown frame flags %#x", ErrFrame, frameFlags)
	}
	n := int(binary.LittleEndian.Uint16(hdr[6:]))
	if n > lim.MaxTensors {
		return nil, fmt.Errorf("%w: %d tensors, limit %d", ErrFrameLimit, n, lim.MaxTensors)
	}
	f := &Frame{Tensors: make([]Tensor, n)}
	var params, entries int64
	for i := range f.Tensors {
		th, err := r.take(2)
		if err != nil {
			return nil, err
		}
		ndim, flags := int(th[0]), th[1]
		if flags&^3 != 0 {
			return nil, fmt.Errorf("%w: tensor %d: unknown flags", ErrFrame, i)
		}
		if ndim == 0 || ndim > MaxDims {
			return nil, fmt.Errorf("%w: tensor %d has %d dims", ErrFrame, i, ndim)
		}
		t := &f.Tensors[i]
		t.Quantized = flags&1 != 0
		t.RiceIndices = flags&2 != 0
		var fields [3 + MaxDims]int
		for j := range 3 + ndim {
			if fields[j], err = r.uvarint(); err != nil {
				return nil, fmt.Errorf("tensor %d: %w", i, err)
			}
		}
		t.TileH, t.TileW, t.K = fields[0], fields[1], fields[2]
		t.Shape = append([]int(nil), fields[3:3+ndim]...)
		if ndim == 1 && t.TileH != 1 {
			return nil, fmt.Errorf("%w: tensor %d is 1-D with tile height %d", ErrFrame, i, t.TileH)
		}
		tiles, ts, err := geometry(t.Shape, t.TileH, t.TileW, t.K)
		if err != nil {
			return nil, fmt.Errorf("tensor %d: %w", i, err)
		}
		params += tiles * ts
		count := tiles * int64(t.K)
		entries += count
		if params > lim.MaxParams || entries > lim.MaxEntries {
			return nil, fmt.Errorf("%w: %d parameters and %d entries so far, limits %d and %d",
				ErrFrameLimit, params, entries, lim.MaxParams, lim.MaxEntries)
		}
		if t.RiceIndices {
			var used int
			if t.Indices, used, err = readRiceIndices(data[r.off:], count, int(ts), t.K); err != nil {
				return nil, fmt.Errorf("tensor %d: %w", i, err)
			}
			r.off += used
		} else if err := readFixedIndices(r, t, count, indexWidth(int(ts))); err != nil {
			return nil, err
		}
		valueBytes := 4 * count
		if t.Quantized {
			valueBytes = (count + 7) / 8
		}
		vb, err := r.take(valueBytes)
		if err != nil {
			return nil, err
		}
		t.Values = make([]float32, count)
		if t.Quantized {
			for j := range t.Values {
				t.Values[j] = -1
				if vb[j/8]>>(j%8)&1 == 1 {
					t.Values[j] = 1
				}
			}
			if rem := count % 8; rem != 0 && vb[len(vb)-1]>>rem != 0 {
				return nil, fmt.Errorf("%w: tensor %d: spare sign bits set", ErrFrame, i)
			}
		} else {
			for j := range t.Values {
				t.Values[j] = math.Float32frombits(binary.LittleEndian.Uint32(vb[4*j:]))
			}
		}
		if err := checkEntries(t, int(ts)); err != nil {
			return nil, fmt.Errorf("tensor %d: %w", i, err)
		}
	}
	if frameFlags&1 != 0 {
		n, err := r.uvarint()
		if err != nil {
			return nil, fmt.Errorf("sequence losses: %w", err)
		}
		if n == 0 || n > min(lim.MaxLosses, MaxLosses) {
			return nil, fmt.Errorf("%w: %d sequence losses, limit %d", ErrFrameLimit, n, min(lim.MaxLosses, MaxLosses))
		}
		lb, err := r.take(4 * int64(n))
		if err != nil {
			return nil, err
		}
		f.Losses = make([]float32, n)
		for j := range f.Losses {
			f.Losses[j] = math.Float32frombits(binary.LittleEndian.Uint32(lb[4*j:]))
		}
		if err := checkLosses(f.Losses); err != nil {
			return nil, err
		}
	}
	if r.off != len(data) {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrFrame, len(data)-r.off)
	}
	return f, nil
}

// readFixedIndices reads count indices of width bytes each.
func readFixedIndices(r *frameReader, t *Tensor, count int64, width int) error {
	ib, err := r.take(count * int64(width))
	if err != nil {
		return err
	}
	t.Indices = make([]uint32, count)
	for j := range t.Indices {
		switch width {
		case 1:
			t.Indices[j] = uint32(ib[j])
		case 2:
			t.Indices[j] = uint32(binary.LittleEndian.Uint16(ib[2*j:]))
		default:
			t.Indices[j] = binary.LittleEndian.Uint32(ib[4*j:])
		}
	}
	return nil
}

// WireSize is the encoded size of the frame in bytes.
func (f *Frame) WireSize() int {
	size := 8 + lossesBytes(len(f.Losses))
	for i := range f.Tensors {
		t := &f.Tensors[i]
		n := len(t.Indices)
		size += tensorHeaderSize(t) + indexBytes(t)
		if t.Quantized {
			size += (n + 7) / 8
		} else {
			size += 4 * n
		}
	}
	return size
}

// Fingerprint is what f says without its magnitudes: for each tensor its
// shape and tiling, the coefficient indices it carries and the sign of each
// value, hashed. Two frames with one fingerprint point every parameter the
// same way; a frame scaled by any positive factor keeps its fingerprint. Two
// trainers on different data (or one trainer on two steps) do not produce
// the same one: witnesses use it to catch a result copied from another
// trainer, or replayed from an earlier step (see trainer/node).
func (f *Frame) Fingerprint() [32]byte {
	h := sha256.New()
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	put(uint64(len(f.Tensors)))
	for _, t := range f.Tensors {
		put(uint64(len(t.Shape)))
		for _, d := range t.Shape {
			put(uint64(d))
		}
		put(uint64(t.TileH))
		put(uint64(t.TileW))
		put(uint64(t.K))
		put(uint64(len(t.Indices)))
		for _, i := range t.Indices {
			binary.LittleEndian.PutUint32(b[:4], i)
			h.Write(b[:4])
		}
		var signs byte
		for j, v := range t.Values {
			if v < 0 {
				signs |= 1 << (j % 8)
			}
			if j%8 == 7 || j == len(t.Values)-1 {
				h.Write([]byte{signs})
				signs = 0
			}
		}
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}
