package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/bits"
	"os"
	"slices"
	"strings"
	"unicode/utf8"
)

// Limits bounds what a reader accepts. The zero value is the default: a
// header of at most DefaultMaxHeaderSize bytes and data bounded only by the
// size of the input.
type Limits struct {
	// MaxHeaderSize caps the JSON header (0: DefaultMaxHeaderSize). The
	// header is read into memory before anything else is checked.
	MaxHeaderSize int64
	// MaxDataSize caps the tensor bytes (0: no cap). Set it when the size
	// passed to Read comes from an untrusted peer, since the reader
	// allocates memory for the tensors the header announces.
	MaxDataSize int64
}

// Load reads a checkpoint file with the default Limits.
func Load(path string) (*Checkpoint, error) { return Limits{}.Load(path) }

// Decode parses checkpoint bytes with the default Limits. The result does
// not alias data.
func Decode(data []byte) (*Checkpoint, error) { return Limits{}.Decode(data) }

// Read parses a checkpoint of exactly size bytes from r with the default
// Limits.
func Read(r io.Reader, size int64) (*Checkpoint, error) { return Limits{}.Read(r, size) }

// Load reads the checkpoint file at path.
func (l Limits) Load(path string) (*Checkpoint, error) {
	f, size, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := l.Read(f, size)
	if err != nil {
		return nil, naming(path, err)
	}
	return c, nil
}

// openRegular opens the checkpoint file at path and says its size; anything
// but a regular file (a directory, a FIFO that would block) is refused.
func openRegular(path string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("checkpoint: load: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("checkpoint: load: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("checkpoint: load %s: not a regular file", path)
	}
	return f, fi.Size(), nil
}

// naming puts the file's path in a format error about its bytes.
func naming(path string, err error) error {
	var fe *formatError
	if errors.As(err, &fe) {
		fe.detail = path + ": " + fe.detail
	}
	return err
}

// Decode parses checkpoint bytes. The result does not alias data.
func (l Limits) Decode(data []byte) (*Checkpoint, error) {
	return l.Read(bytes.NewReader(data), int64(len(data)))
}

// Read parses a checkpoint from r, which must deliver at least size bytes,
// size being the whole checkpoint's length (the format has no terminator:
// the last tensor ends where the input ends, so the reader must know where
// that is to tell a complete file from a truncated one). Read consumes
// exactly size bytes on success. Every rejection of the bytes wraps
// ErrMalformed; an I/O error of r is returned as is, wrapped with context.
func (l Limits) Read(r io.Reader, size int64) (*Checkpoint, error) {
	entries, meta, dataSize, err := l.readHeader(r, size)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{tensors: make(map[string]*stored, len(entries)), meta: meta}
	// parseHeader returned the entries in offset order, back to back, so the
	// data can be read in one pass with one scratch buffer.
	buf := make([]byte, min(chunkSize, dataSize))
	for _, e := range entries {
		data := make([]float32, e.numel)
		per := len(buf) / e.dtype.size
		for rest := data; len(rest) > 0; {
			k := min(len(rest), per)
			chunk := buf[:k*e.dtype.size]
			if err := readFull(r, chunk); err != nil {
				return nil, err
			}
			e.dtype.decode(rest[:k], chunk)
			rest = rest[k:]
		}
		c.tensors[e.name] = &stored{shape: e.shape, data: data, dtype: e.dtypeName}
		c.names = append(c.names, e.name)
	}
	slices.Sort(c.names)
	return c, nil
}

// readHeader reads and validates the header of a checkpoint of size bytes
// from r, leaving r at the start of the data: the tensors sorted by
// offset, the metadata and the data section's size.
func (l Limits) readHeader(r io.Reader, size int64) ([]entry, map[string]string, int64, error) {
	maxHeader := l.MaxHeaderSize
	if maxHeader <= 0 {
		maxHeader = DefaultMaxHeaderSize
	}
	if size < lengthSize {
		return nil, nil, 0, formatErr(ErrTruncated, "%d bytes, fewer than the %d-byte header length", max(size, 0), lengthSize)
	}
	var length [lengthSize]byte
	if err := readFull(r, length[:]); err != nil {
		return nil, nil, 0, err
	}
	n := binary.LittleEndian.Uint64(length[:])
	switch {
	case n > uint64(maxHeader):
		return nil, nil, 0, formatErr(ErrTooLarge, "header length %d exceeds the limit of %d bytes", n, maxHeader)
	case n > uint64(size-lengthSize):
		return nil, nil, 0, formatErr(ErrTruncated, "header length %d exceeds the %d bytes after it", n, size-lengthSize)
	}
	header := make([]byte, n)
	if err := readFull(r, header); err != nil {
		return nil, nil, 0, err
	}
	dataSize := size - lengthSize - int64(n)
	if l.MaxDataSize > 0 && dataSize > l.MaxDataSize {
		return nil, nil, 0, formatErr(ErrTooLarge, "%d data bytes exceed the limit of %d", dataSize, l.MaxDataSize)
	}
	entries, meta, err := parseHeader(header, uint64(dataSize))
	if err != nil {
		return nil, nil, 0, err
	}
	return entries, meta, dataSize, nil
}

// TensorInfo is a tensor as a checkpoint's header describes it.
type TensorInfo struct {
	Name  string
	Shape []int
	DType string // how the file stores it: F32, F16 or BF16
}

// LoadHeader reads the header of the checkpoint file at path, validated as
// Load validates it, and none of its data: the tensors it holds, by name,
// which a caller checks against a model before reading gigabytes.
func (l Limits) LoadHeader(path string) ([]TensorInfo, error) {
	f, err := l.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Tensors(), nil
}

// readFull reads len(b) bytes, reporting an early end of input as
// ErrTruncated.
func readFull(r io.Reader, b []byte) error {
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return formatErr(ErrTruncated, "input ended early")
		}
		return fmt.Errorf("checkpoint: read: %w", err)
	}
	return nil
}

// entry is one tensor of a header, validated.
type entry struct {
	name       string
	dtypeName  string
	dtype      dtype
	shape      []int
	numel      int
	begin, end uint64
}

// parseHeader validates a header against a data section of dataSize bytes
// and returns its tensors sorted by offset and its metadata (never nil).
func parseHeader(header []byte, dataSize uint64) ([]entry, map[string]string, error) {
	if !utf8.Valid(header) {
		return nil, nil, malformed("header is not valid UTF-8")
	}
	// Other readers insist on the object starting at the first byte, so we
	// do too rather than accept files they would refuse.
	if len(header) == 0 || header[0] != '{' {
		return nil, nil, malformed("header does not start with '{'")
	}
	members, err := objectMembers(header)
	if err != nil {
		return nil, nil, malformed("header JSON: %v", err)
	}
	meta := map[string]string{}
	entries := make([]entry, 0, len(members))
	for _, m := range members {
		if m.key == metadataKey {
			if meta, err = parseMetadata(m.value); err != nil {
				return nil, nil, err
			}
			continue
		}
		e, err := parseEntry(m.key, m.value, dataSize)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}

	// Sorting by (begin, end) puts empty tensors before a non-empty one that
	// starts at the same offset, so the walk below accepts them there.
	slices.SortFunc(entries, func(a, b entry) int {
		if a.begin != b.begin {
			return cmpU64(a.begin, b.begin)
		}
		if a.end != b.end {
			return cmpU64(a.end, b.end)
		}
		return strings.Compare(a.name, b.name)
	})
	var cursor uint64
	for i, e := range entries {
		switch {
		case e.begin < cursor:
			return nil, nil, malformed("tensor %q data_offsets [%d,%d] overlap tensor %q", e.name, e.begin, e.end, entries[i-1].name)
		case e.begin > cursor:
			return nil, nil, malformed("data bytes [%d,%d) are not covered by any tensor", cursor, e.begin)
		}
		cursor = e.end
	}
	if cursor != dataSize {
		return nil, nil, malformed("data bytes [%d,%d) are not covered by any tensor", cursor, dataSize)
	}
	return entries, meta, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func parseMetadata(v json.RawMessage) (map[string]string, error) {
	if jsonKind(v) != '{' {
		return nil, malformed("%s must be an object, not %s", metadataKey, truncate(v))
	}
	members, err := objectMembers(v)
	if err != nil {
		return nil, malformed("%s: %v", metadataKey, err)
	}
	meta := make(map[string]string, len(members))
	for _, m := range members {
		s, err := decodeString(m.value)
		if err != nil {
			return nil, malformed("%s[%q]: %v", metadataKey, m.key, err)
		}
		meta[m.key] = s
	}
	return meta, nil
}

func parseEntry(name string, v json.RawMessage, dataSize uint64) (entry, error) {
	e := entry{name: name}
	switch {
	case name == "":
		return e, malformed("a tensor has an empty name")
	case strings.HasPrefix(name, "__"):
		return e, malformed("tensor name %q is reserved (starts with \"__\")", name)
	case jsonKind(v) != '{':
		return e, malformed("tensor %q: entry must be an object, not %s", name, truncate(v))
	}
	members, err := objectMembers(v)
	if err != nil {
		return e, malformed("tensor %q: %v", name, err)
	}
	var haveDType, haveShape, haveOffsets bool
	var offsets []uint64
	for _, m := range members {
		switch m.key {
		case "dtype":
			haveDType = true
			if e.dtypeName, err = decodeString(m.value); err != nil {
				return e, malformed("tensor %q: dtype: %v", name, err)
			}
		case "shape":
			haveShape = true
			if err = decodeArray(m.value, &e.shape); err != nil {
				return e, malformed("tensor %q: shape: %v", name, err)
			}
		case "data_offsets":
			haveOffsets = true
			if err = decodeArray(m.value, &offsets); err != nil {
				return e, malformed("tensor %q: data_offsets: %v", name, err)
			}
		default:
			// An unknown field might change what the bytes mean; refusing
			// is safer than guessing.
			return e, malformed("tensor %q: unknown field %q", name, m.key)
		}
	}
	switch {
	case !haveDType:
		return e, malformed("tensor %q: missing dtype", name)
	case !haveShape:
		return e, malformed("tensor %q: missing shape", name)
	case !haveOffsets:
		return e, malformed("tensor %q: missing data_offsets", name)
	}
	var ok bool
	if e.dtype, ok = dtypes[e.dtypeName]; !ok {
		return e, formatErr(ErrUnsupportedDType, "tensor %q has dtype %q (supported: F32, F16, BF16)", name, e.dtypeName)
	}
	if e.shape == nil {
		e.shape = []int{} // a scalar; never nil, so callers can tell it from a missing tensor
	}
	numel, err := numElements(e.shape)
	if err != nil {
		return e, malformed("tensor %q: %v", name, err)
	}
	if len(offsets) != 2 {
		return e, malformed("tensor %q: data_offsets has %d numbers, want 2", name, len(offsets))
	}
	e.begin, e.end = offsets[0], offsets[1]
	if e.begin > e.end {
		return e, malformed("tensor %q: data_offsets [%d,%d] end before they begin", name, e.begin, e.end)
	}
	if e.end > dataSize {
		return e, malformed("tensor %q: data_offsets [%d,%d] exceed the %d data bytes", name, e.begin, e.end, dataSize)
	}
	hi, want := bits.Mul64(numel, uint64(e.dtype.size))
	if hi != 0 || want != e.end-e.begin {
		return e, malformed("tensor %q: shape %s of %s needs %d×%d bytes, data_offsets [%d,%d] hold %d",
			name, shapeString(e.shape), e.dtypeName, numel, e.dtype.size, e.begin, e.end, e.end-e.begin)
	}
	e.numel = int(numel) // ≤ dataSize, which came from an int64
	return e, nil
}

// decodeArray decodes a JSON array (not null) of integers into dst.
func decodeArray[T int | uint64](v json.RawMessage, dst *[]T) error {
	if jsonKind(v) != '[' {
		return fmt.Errorf("%s is not an array", truncate(v))
	}
	return json.Unmarshal(v, dst)
}

// stored is one loaded tensor.
type stored struct {
	shape []int
	data  []float32
	dtype string
}

// Checkpoint is a decoded checkpoint: named float32 tensors and string
// metadata. It is safe for concurrent reads.
type Checkpoint struct {
	tensors map[string]*stored
	names   []string
	meta    map[string]string
}

// Names returns the tensor names in sorted order.
func (c *Checkpoint) Names() []string { return slices.Clone(c.names) }

// Metadata returns a copy of the "__metadata__" object (empty, not nil, when
// the file has none).
func (c *Checkpoint) Metadata() map[string]string { return maps.Clone(c.meta) }

// Shape returns the shape of the named tensor and whether it exists.
func (c *Checkpoint) Shape(name string) ([]int, bool) {
	s, ok := c.tensors[name]
	if !ok {
		return nil, false
	}
	return slices.Clone(s.shape), true
}

// DType returns the dtype the named tensor had in the file ("F32", "F16" or
// "BF16"; it is float32 in memory whatever it was), or "" if there is no
// such tensor.
func (c *Checkpoint) DType(name string) string {
	if s, ok := c.tensors[name]; ok {
		return s.dtype
	}
	return ""
}

// Infos lists the tensors as the file's header described them, in name
// order.
func (c *Checkpoint) Infos() []TensorInfo {
	out := make([]TensorInfo, len(c.names))
	for i, name := range c.names {
		s := c.tensors[name]
		out[i] = TensorInfo{Name: name, Shape: slices.Clone(s.shape), DType: s.dtype}
	}
	return out
}

// Read copies values [off, off+len(dst)) of the named tensor into dst.
func (c *Checkpoint) Read(name string, off int, dst []float32) error {
	s, ok := c.tensors[name]
	if !ok {
		return wrap(ErrNotFound, "%q", name)
	}
	if off < 0 || off+len(dst) > len(s.data) {
		return fmt.Errorf("checkpoint: values [%d, %d) of tensor %q, which has %d", off, off+len(dst), name, len(s.data))
	}
	copy(dst, s.data[off:])
	return nil
}

// Tensor returns the data of the named tensor, checking that it has exactly
// the expected shape (a model loading its parameters states what it needs,
// so a checkpoint of another architecture fails here rather than producing
// garbage). It wraps ErrNotFound or ErrShapeMismatch. The slice is the
// checkpoint's own, not a copy: copy it before modifying it if the
// checkpoint is used again.
func (c *Checkpoint) Tensor(name string, shape []int) ([]float32, error) {
	s, ok := c.tensors[name]
	if !ok {
		return nil, wrap(ErrNotFound, "%q", name)
	}
	if !slices.Equal(s.shape, shape) {
		return nil, wrap(ErrShapeMismatch, "tensor %q has shape %s, want %s", name, shapeString(s.shape), shapeString(shape))
	}
	return s.data, nil
}

// Tensors returns every tensor in name order, ready to pass to Save. Shapes
// are copies; Data slices are the checkpoint's own.
func (c *Checkpoint) Tensors() []Tensor {
	out := make([]Tensor, len(c.names))
	for i, name := range c.names {
		s := c.tensors[name]
		out[i] = Tensor{Name: name, Shape: slices.Clone(s.shape), Data: s.data}
	}
	return out
}
