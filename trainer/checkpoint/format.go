package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/psyche-go/psyche/internal/f32le"
)

// The format's fixed parts.
const (
	// lengthSize is the size of the little-endian header length that starts
	// every file.
	lengthSize = 8
	// metadataKey is the one header key that is not a tensor.
	metadataKey = "__metadata__"
	// headerAlign is the multiple the header length is padded to, so that the
	// data section starts 8-byte aligned when the file is mapped.
	headerAlign = 8
	// chunkSize bounds the scratch buffer used to convert between float32
	// and bytes, and is how often a long write checks its context.
	chunkSize = 1 << 20
)

// DefaultMaxHeaderSize is the largest header Load, Decode and Read accept
// with zero Limits, and the largest Save writes. A header costs ~80 bytes
// per tensor, so 100 MiB is a million tensors, far more than any model we
// train, while it stops a hostile length from allocating gigabytes.
const DefaultMaxHeaderSize = 100 << 20

// HeaderLimit is the largest header a checkpoint of a model with layers
// transformer blocks needs, for a reader that knows which model it expects
// (Limits.MaxHeaderSize): 64 KiB of metadata, and 1 KiB for each of up to 16
// tensors per block (Hugging Face layouts store one per projection and
// norm) and 8 more (embeddings, final norm, head). An entry takes ~120
// bytes, so the bound is generous for real files, while a hostile header is
// refused from its length alone, before it is read.
func HeaderLimit(layers int) int64 {
	return 64<<10 + (16*int64(max(layers, 0))+8)<<10
}

// dtype describes one element type a file may hold.
type dtype struct {
	size   int
	decode func(dst []float32, src []byte) // len(src) == size*len(dst)
	encode func(dst []byte, src []float32) // len(dst) >= size*len(src)
}

var dtypes = map[string]dtype{
	"F32":  {4, decodeF32, encodeF32},
	"F16":  {2, decodeF16, encodeF16},
	"BF16": {2, decodeBF16, encodeBF16},
}

// encodeBF16 rounds to bfloat16, the top half of a float32, to the nearest
// value, ties to even (as PyTorch's .to(torch.bfloat16) does); a NaN stays a
// (quiet) NaN rather than rounding into an infinity.
func encodeBF16(dst []byte, src []float32) {
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
	}
}

// F32ToBF16 rounds v to bfloat16 bits (nearest, ties to even).
func F32ToBF16(v float32) uint16 {
	b := math.Float32bits(v)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

func encodeF16(dst []byte, src []float32) {
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
	}
}

// F32ToF16 rounds v to IEEE 754 binary16 bits: nearest, ties to even,
// subnormals kept, values beyond 65504 (after rounding) to infinity, NaN to
// a quiet NaN.
func F32ToF16(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff && mant != 0:
		return sign | 0x7e00
	case exp == 0xff:
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal (or zero) in binary16: the value is m·2^-24 with m the
		// full significand shifted right by 1−e+13 bits, rounded.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rest := m & (1<<shift - 1)
		if rest > half || (rest == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | mant>>13
	rest := mant & 0x1fff
	if rest > 0x1000 || (rest == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, up to infinity: still correct
	}
	return sign | uint16(r)
}

func decodeF32(dst []float32, src []byte) { f32le.Decode(dst, src) }

func encodeF32(dst []byte, src []float32) { f32le.Put(dst, src) }

// decodeBF16 widens bfloat16, which is the top half of a float32.
func decodeBF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

func decodeF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = f16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// f16ToF32 widens an IEEE 754 binary16 value exactly (every binary16 value,
// subnormals included, is a normal binary32 value; NaN payloads are kept).
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // infinity or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: mant·2^-24; normalize so bit 10 is the implicit 1
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	default:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
}

// numElements is the product of shape, or an error if a dimension is
// negative or the product overflows uint64. A zero dimension makes the
// product 0 however large the others are.
func numElements(shape []int) (uint64, error) {
	zero := false
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("dimension %d is negative (%d)", i, d)
		}
		zero = zero || d == 0
	}
	if zero {
		return 0, nil
	}
	n := uint64(1)
	for _, d := range shape {
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 {
			return 0, fmt.Errorf("shape %s has too many elements", shapeString(shape))
		}
		n = lo
	}
	return n, nil
}

func shapeString(shape []int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range shape {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(d))
	}
	b.WriteByte(']')
	return b.String()
}

// appendJSONString appends s as a JSON string. Only the characters JSON
// requires are escaped (unlike encoding/json, which also escapes <, > and &
// for HTML), so the header stays readable and its bytes depend on nothing but
// s. s must be valid UTF-8.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for len(s) > 0 {
		// Copy the run of bytes that need no escape in one append: names and
		// values are almost always entirely such a run.
		i := 0
		for i < len(s) && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\' {
			i++
		}
		b = append(b, s[:i]...)
		if i == len(s) {
			break
		}
		if c := s[i]; c < 0x20 {
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		} else {
			b = append(b, '\\', c)
		}
		s = s[i+1:]
	}
	return append(b, '"')
}

// member is one key and raw value of a JSON object, in file order.
type member struct {
	key   string
	value json.RawMessage
}

// objectMembers splits a JSON object into its members, rejecting anything
// else: a non-object, a duplicate key (encoding/json would silently keep the
// last one, so two readers could disagree about a file), or bytes after the
// object other than whitespace.
func objectMembers(raw []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var out []member
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("object key is not a string")
		}
		if seen[key] {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, member{key, v})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected data after the JSON object")
	}
	return out, nil
}

// jsonKind is the first byte of a raw JSON value: '{', '[', '"', 'n' (null),
// 't'/'f' or a number's first character. encoding/json decodes null into
// anything without an error, so callers check the kind first.
func jsonKind(v json.RawMessage) byte {
	v = bytes.TrimLeft(v, " \t\r\n")
	if len(v) == 0 {
		return 0
	}
	return v[0]
}

// decodeString decodes a raw JSON string value (not null).
func decodeString(v json.RawMessage) (string, error) {
	if jsonKind(v) != '"' {
		return "", fmt.Errorf("%s is not a string", truncate(v))
	}
	var s string
	err := json.Unmarshal(v, &s)
	return s, err
}

// truncate shortens a raw JSON value for an error message, so a hostile
// header cannot make an error message huge. It cuts at a character boundary.
func truncate(v json.RawMessage) string {
	const limit = 40
	if len(v) <= limit {
		return string(v)
	}
	i := limit
	for i > 0 && !utf8.RuneStart(v[i]) {
		i--
	}
	return string(v[:i]) + "..."
}
