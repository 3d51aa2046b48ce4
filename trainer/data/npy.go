package data

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The NumPy .npy format (numpy.lib.format), as far as a 1-D integer array
// needs it. Offsets:
//
//	bytes       version 1.0              versions 2.0 and 3.0
//	0-5         magic "\x93NUMPY"        magic "\x93NUMPY"
//	6           major version (1)        major version (2 or 3)
//	7           minor version (0)        minor version (0)
//	8-9         header length H, u16 LE  -
//	8-11        -                        header length H, u32 LE
//	10…10+H     header                   -
//	12…12+H     -                        header (3.0: UTF-8, else ASCII)
//	then        the array's data         the array's data
//
// The header is a Python dict literal such as
// "{'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }", padded
// with spaces and ended by "\n". This package reads descr <u2, <u4, <i4,
// <i8 and the other 1-, 2-, 4- and 8-byte integer dtypes of either byte
// order, fortran_order False and a 1-D shape.
const (
	npyMagic        = "\x93NUMPY"
	npyPrefixV1     = 10 // magic, version, u16 header length
	npyPrefixV2     = 12 // magic, version, u32 header length
	npyMaxHeaderLen = 1 << 16
	npyExt          = ".npy"
)

// ErrNpyHeader: a .npy file's header is malformed or describes an array
// that cannot be a token file (not 1-D, not integers, Fortran order).
var ErrNpyHeader = errors.New("data: bad .npy header")

// isNpy says whether a data location names a .npy file (by its path's
// extension, ignoring a URL's query).
func isNpy(location string) bool {
	path, _, _ := strings.Cut(location, "?")
	return strings.HasSuffix(strings.ToLower(path), npyExt)
}

// readNpyLayout reads a .npy file's header from src and returns the layout
// of its data, checked against the file's size.
func readNpyLayout(ctx context.Context, src Source, name string) (Layout, error) {
	size, err := src.Size(ctx)
	if err != nil {
		return Layout{}, err
	}
	prefix := make([]byte, min(size, npyPrefixV2))
	if err := src.ReadAt(ctx, prefix, 0); err != nil {
		return Layout{}, err
	}
	hlen, start, err := parseNpyPrefix(prefix)
	if err != nil {
		return Layout{}, fmt.Errorf("%w: %s: %w", ErrNpyHeader, name, err)
	}
	if int64(start)+int64(hlen) > size {
		return Layout{}, fmt.Errorf("%w: %s: the header of %d bytes runs past the end of the file (%d bytes)", ErrNpyHeader, name, hlen, size)
	}
	header := make([]byte, hlen)
	if err := src.ReadAt(ctx, header, int64(start)); err != nil {
		return Layout{}, err
	}
	l, err := parseNpyHeader(header)
	if err != nil {
		return Layout{}, fmt.Errorf("%w: %s: %w", ErrNpyHeader, name, err)
	}
	l.Offset = int64(start + hlen)
	if data := size - l.Offset; data/int64(l.Width) != l.Count || data%int64(l.Width) != 0 {
		return Layout{}, fmt.Errorf("%w: %s: shape (%d,) of %s needs %d bytes of data after the header, the file has %d",
			ErrNpyHeader, name, l.Count, l, l.Count*int64(l.Width), data)
	}
	return l, nil
}

// parseNpyPrefix reads the magic, the version and the header length from
// the first bytes of a .npy file; it returns the header's length and where
// it starts.
func parseNpyPrefix(b []byte) (hlen, start int, err error) {
	if len(b) < npyPrefixV1 || string(b[:len(npyMagic)]) != npyMagic {
		return 0, 0, errors.New("no \\x93NUMPY magic: not a .npy file")
	}
	major, minor := b[6], b[7]
	switch {
	case major == 1 && minor == 0:
		hlen, start = int(binary.LittleEndian.Uint16(b[8:])), npyPrefixV1
	case (major == 2 || major == 3) && minor == 0:
		if len(b) < npyPrefixV2 {
			return 0, 0, errors.New("the file ends inside the header length")
		}
		h := binary.LittleEndian.Uint32(b[8:])
		if h > npyMaxHeaderLen {
			return 0, 0, fmt.Errorf("header length %d exceeds the limit of %d bytes", h, npyMaxHeaderLen)
		}
		hlen, start = int(h), npyPrefixV2
	default:
		return 0, 0, fmt.Errorf("version %d.%d is not 1.0, 2.0 or 3.0", major, minor)
	}
	return hlen, start, nil
}

// parseNpyHeader parses the header dict. The returned layout has Width,
// Signed, BigEndian and Count set; the caller sets Offset.
func parseNpyHeader(b []byte) (Layout, error) {
	p := &pyParser{s: string(b)}
	d, err := p.dict()
	if err != nil {
		return Layout{}, err
	}
	if rest := strings.TrimRight(p.s[p.i:], " \t\n\x00"); rest != "" {
		return Layout{}, fmt.Errorf("text after the header dict: %q", truncateText(rest))
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if _, ok := d[k]; !ok {
			return Layout{}, fmt.Errorf("no %q in the header", k)
		}
	}
	if len(d) != 3 {
		return Layout{}, fmt.Errorf("the header has keys other than descr, fortran_order and shape")
	}
	descr, ok := d["descr"].(string)
	if !ok {
		return Layout{}, errors.New("descr: not a string (structured dtypes are not token arrays)")
	}
	l, err := parseDescr(descr)
	if err != nil {
		return Layout{}, fmt.Errorf("descr: %w", err)
	}
	if fo, ok := d["fortran_order"].(bool); !ok || fo {
		return Layout{}, fmt.Errorf("fortran_order: must be False, got %v", d["fortran_order"])
	}
	shape, ok := d["shape"].([]int64)
	if !ok || len(shape) != 1 {
		return Layout{}, fmt.Errorf("shape: must be 1-D, (N,), got %v", d["shape"])
	}
	if shape[0] < 0 || shape[0] > (1<<62)/int64(l.Width) {
		return Layout{}, fmt.Errorf("shape: length %d out of range", shape[0])
	}
	l.Count = shape[0]
	return l, nil
}

// parseDescr reads an integer dtype string: byte order ('<' little, '>'
// big, '|' for one byte), kind ('u' or 'i') and size (1, 2, 4 or 8).
func parseDescr(s string) (Layout, error) {
	if len(s) != 3 {
		return Layout{}, fmt.Errorf("%q is not an integer dtype such as '<u2' or '<i8'", s)
	}
	var l Layout
	switch s[1] {
	case 'u':
	case 'i':
		l.Signed = true
	default:
		return Layout{}, fmt.Errorf("%q is not an integer dtype such as '<u2' or '<i8'", s)
	}
	switch s[2] {
	case '1', '2', '4', '8':
		l.Width = int(s[2] - '0')
	default:
		return Layout{}, fmt.Errorf("%q: integer size must be 1, 2, 4 or 8 bytes", s)
	}
	switch s[0] {
	case '<':
	case '>':
		l.BigEndian = l.Width > 1
	case '|':
		if l.Width != 1 {
			return Layout{}, fmt.Errorf("%q: byte order '|' only for 1-byte integers", s)
		}
	default:
		return Layout{}, fmt.Errorf("%q: byte order must be '<' or '>' ('=' is the writer's own order, unknown here)", s)
	}
	return l, nil
}

// appendNpyHeader appends the prefix and header numpy.save writes for a 1-D
// array of count tokens of layout l (version 1.0, padded to 64 bytes).
func appendNpyHeader(dst []byte, l Layout, count int64) []byte {
	fo := "False"
	header := fmt.Sprintf("{'descr': '%s', 'fortran_order': %s, 'shape': (%d,), }", l, fo, count)
	total := npyPrefixV1 + len(header) + 1
	pad := (64 - total%64) % 64
	header += strings.Repeat(" ", pad) + "\n"
	dst = append(dst, npyMagic...)
	dst = append(dst, 1, 0)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(header)))
	return append(dst, header...)
}

// pyParser parses the Python literals of a .npy header: a dict of string
// keys whose values are strings, True/False or tuples of integers.
type pyParser struct {
	s string
	i int
}

func (p *pyParser) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n') {
		p.i++
	}
}

func (p *pyParser) expect(c byte) error {
	p.space()
	if p.i >= len(p.s) || p.s[p.i] != c {
		return p.errorf("expected %q", c)
	}
	p.i++
	return nil
}

func (p *pyParser) errorf(format string, args ...any) error {
	return fmt.Errorf("header %q: at byte %d: %s", truncateText(p.s), p.i, fmt.Sprintf(format, args...))
}

func (p *pyParser) peek() byte {
	p.space()
	if p.i >= len(p.s) {
		return 0
	}
	return p.s[p.i]
}

func (p *pyParser) dict() (map[string]any, error) {
	if err := p.expect('{'); err != nil {
		return nil, err
	}
	d := map[string]any{}
	for p.peek() != '}' {
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		if _, dup := d[k]; dup {
			return nil, p.errorf("key %q twice", k)
		}
		if err := p.expect(':'); err != nil {
			return nil, err
		}
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		d[k] = v
		if p.peek() != ',' {
			break
		}
		p.i++
	}
	return d, p.expect('}')
}

func (p *pyParser) str() (string, error) {
	q := p.peek()
	if q != '\'' && q != '"' {
		return "", p.errorf("expected a string")
	}
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", p.errorf("unterminated string")
	}
	s := p.s[p.i+1 : p.i+1+end]
	if strings.ContainsRune(s, '\\') {
		return "", p.errorf("escapes in strings are not supported")
	}
	p.i += end + 2
	return s, nil
}

func (p *pyParser) value() (any, error) {
	switch c := p.peek(); {
	case c == '\'' || c == '"':
		return p.str()
	case c == '(':
		return p.tuple()
	case strings.HasPrefix(p.s[p.i:], "True"):
		p.i += 4
		return true, nil
	case strings.HasPrefix(p.s[p.i:], "False"):
		p.i += 5
		return false, nil
	}
	return nil, p.errorf("expected a string, a tuple, True or False")
}

func (p *pyParser) tuple() ([]int64, error) {
	if err := p.expect('('); err != nil {
		return nil, err
	}
	var t []int64
	comma := false
	for p.peek() != ')' {
		start := p.i
		for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
			p.i++
		}
		n, err := strconv.ParseInt(p.s[start:p.i], 10, 64)
		if err != nil {
			return nil, p.errorf("expected a non-negative integer")
		}
		if p.i < len(p.s) && p.s[p.i] == 'L' { // Python 2's long suffix
			p.i++
		}
		t = append(t, n)
		if len(t) > 32 {
			return nil, p.errorf("more than 32 dimensions")
		}
		if comma = p.peek() == ','; !comma {
			break
		}
		p.i++
	}
	if len(t) == 1 && !comma {
		return nil, p.errorf("(%d) is an integer, not a tuple: a 1-D shape is written (%d,)", t[0], t[0])
	}
	if t == nil {
		t = []int64{}
	}
	return t, p.expect(')')
}

func truncateText(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
