package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/psyche-go/psyche/internal/atomicfile"
)

// Tensor is a named float32 tensor in row-major order. Shape may be empty
// for a scalar (one element); a zero dimension makes an empty tensor.
type Tensor struct {
	// Name identifies the tensor in the file: non-empty UTF-8, not starting
	// with "__" (reserved for the format's own keys).
	Name string
	// Shape lists the dimensions, outermost first.
	Shape []int
	// Data holds the product of Shape elements.
	Data []float32
	// Fill, when Data is nil, is where the values come from: it writes
	// values [off, off+len(dst)) into dst, asked for in order and in
	// chunks as the tensor is written or hashed. Parameters too large to
	// copy whole (a model on a worker's device) are read this way, one
	// chunk at a time.
	Fill func(ctx context.Context, off int, dst []float32) error
	// DType is how the file stores the values: "" or "F32" (exact), "F16"
	// or "BF16" (each value rounded to the nearest, ties to even; values
	// beyond the type's range become infinities).
	DType string
}

// len is the number of values: Data's, or the shape's when Fill gives them.
func (t *Tensor) len() int {
	if t.Data == nil && t.Fill != nil {
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		return n
	}
	return len(t.Data)
}

// Chunks hands the tensor's values to f in order, at most n at a time,
// checking ctx before each: slices of Data, or what Fill writes into a
// buffer reused for every chunk (f must not keep it).
func (t *Tensor) Chunks(ctx context.Context, n int, f func(values []float32) error) error {
	var scratch []float32
	return t.chunks(ctx, &scratch, n, f)
}

// chunks is Chunks with the buffer in *scratch (grown as needed and kept
// for the next tensor).
func (t *Tensor) chunks(ctx context.Context, scratch *[]float32, n int, f func([]float32) error) error {
	total := t.len()
	for off := 0; off < total; {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(n, total-off)
		var data []float32
		if t.Data != nil || t.Fill == nil {
			data = t.Data[off : off+k]
		} else {
			if cap(*scratch) < k {
				*scratch = make([]float32, k)
			}
			data = (*scratch)[:k]
			if err := t.Fill(ctx, off, data); err != nil {
				return fmt.Errorf("checkpoint: tensor %q: %w", t.Name, err)
			}
		}
		if err := f(data); err != nil {
			return err
		}
		off += k
	}
	return nil
}

func (t *Tensor) dtype() string {
	if t.DType == "" {
		return "F32"
	}
	return t.DType
}

// plan is a validated, canonical layout of a checkpoint: the padded header
// and the tensors in the order their bytes follow it.
type plan struct {
	header   []byte
	order    []*Tensor
	dataSize int64
}

func (p *plan) size() int64 { return lengthSize + int64(len(p.header)) + p.dataSize }

// prepare validates the inputs and lays them out. It is the only place that
// decides the bytes of a file, so Save, Write and Encode agree exactly.
func prepare(tensors []Tensor, meta map[string]string) (*plan, error) {
	order := make([]*Tensor, len(tensors))
	for i := range tensors {
		t := &tensors[i]
		switch {
		case t.Name == "":
			return nil, wrap(ErrInvalidTensor, "tensor %d has an empty name", i)
		case !utf8.ValidString(t.Name):
			return nil, wrap(ErrInvalidTensor, "tensor %d name %q is not valid UTF-8", i, t.Name)
		case strings.HasPrefix(t.Name, "__"):
			// The format reserves "__metadata__"; we reserve the whole
			// prefix so future special keys cannot collide with a tensor.
			return nil, wrap(ErrInvalidTensor, "tensor name %q is reserved (starts with \"__\")", t.Name)
		}
		if _, ok := dtypes[t.dtype()]; !ok {
			return nil, wrap(ErrInvalidTensor, "tensor %q: dtype %q is not F32, F16 or BF16", t.Name, t.DType)
		}
		n, err := numElements(t.Shape)
		if err != nil {
			return nil, wrap(ErrInvalidTensor, "tensor %q: %v", t.Name, err)
		}
		if t.Data == nil && t.Fill != nil {
			// The values come from Fill: the shape says how many.
		} else if n != uint64(len(t.Data)) {
			return nil, wrap(ErrInvalidTensor, "tensor %q: shape %s has %d elements but data has %d",
				t.Name, shapeString(t.Shape), n, len(t.Data))
		}
		order[i] = t
	}
	slices.SortFunc(order, func(a, b *Tensor) int { return strings.Compare(a.Name, b.Name) })
	for i := 1; i < len(order); i++ {
		if order[i].Name == order[i-1].Name {
			return nil, wrap(ErrInvalidTensor, "duplicate tensor name %q", order[i].Name)
		}
	}

	// The header holds every name, key and value at least once, so their
	// total length bounds it from below: reject a hopeless input before
	// building it.
	rawSize := 0
	for _, t := range tensors {
		rawSize += len(t.Name)
	}
	for k, v := range meta {
		rawSize += len(k) + len(v)
	}
	if rawSize > DefaultMaxHeaderSize {
		return nil, wrap(ErrTooLarge, "names and metadata take %d bytes, more than the %d-byte header a reader accepts by default", rawSize, DefaultMaxHeaderSize)
	}

	keys := make([]string, 0, len(meta))
	for k, v := range meta {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, wrap(ErrInvalidMetadata, "metadata %q: key and value must be valid UTF-8", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)

	h := []byte{'{'}
	if len(keys) > 0 {
		h = append(h, `"`+metadataKey+`":{`...)
		for i, k := range keys {
			if i > 0 {
				h = append(h, ',')
			}
			h = appendJSONString(h, k)
			h = append(h, ':')
			h = appendJSONString(h, meta[k])
		}
		h = append(h, '}')
	}
	var offset int64
	for i, t := range order {
		if i > 0 || len(keys) > 0 {
			h = append(h, ',')
		}
		h = appendJSONString(h, t.Name)
		h = append(h, `:{"dtype":"`+t.dtype()+`","shape":`...)
		h = append(h, shapeString(t.Shape)...)
		end := offset + int64(dtypes[t.dtype()].size)*int64(t.len())
		h = append(h, `,"data_offsets":[`...)
		h = strconv.AppendInt(h, offset, 10)
		h = append(h, ',')
		h = strconv.AppendInt(h, end, 10)
		h = append(h, "]}"...)
		offset = end
	}
	h = append(h, '}')
	for len(h)%headerAlign != 0 {
		h = append(h, ' ')
	}
	if len(h) > DefaultMaxHeaderSize {
		return nil, wrap(ErrTooLarge, "header is %d bytes, more than the %d a reader accepts by default", len(h), DefaultMaxHeaderSize)
	}
	return &plan{header: h, order: order, dataSize: offset}, nil
}

// writeTo writes the planned file to w, checking ctx before each tensor and
// every chunkSize bytes, so a cancelled save of a large model stops quickly.
func (p *plan) writeTo(ctx context.Context, w io.Writer) (int64, error) {
	var written int64
	write := func(b []byte) error {
		n, err := w.Write(b)
		written += int64(n)
		return err
	}
	var length [lengthSize]byte
	binary.LittleEndian.PutUint64(length[:], uint64(len(p.header)))
	if err := write(length[:]); err != nil {
		return written, err
	}
	if err := write(p.header); err != nil {
		return written, err
	}
	buf := make([]byte, min(chunkSize, p.dataSize))
	var values []float32 // a chunk of a tensor that Fill gives
	for _, t := range p.order {
		dt := dtypes[t.dtype()]
		err := t.chunks(ctx, &values, len(buf)/dt.size, func(data []float32) error {
			dt.encode(buf, data)
			return write(buf[:dt.size*len(data)])
		})
		if err != nil {
			return written, err
		}
	}
	return written, ctx.Err()
}

// Encode returns the canonical checkpoint bytes of tensors and meta (see
// Save). It holds the whole file in memory; Write streams it instead.
func Encode(tensors []Tensor, meta map[string]string) ([]byte, error) {
	p, err := prepare(tensors, meta)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(int(p.size()))
	if _, err := p.writeTo(context.Background(), &b); err != nil {
		return nil, fmt.Errorf("checkpoint: encode: %w", err) // a bytes.Buffer cannot fail; kept for safety
	}
	return b.Bytes(), nil
}

// Write writes the canonical checkpoint bytes of tensors and meta to w (see
// Save) and returns the number of bytes written. It validates everything
// before the first byte is written, so an invalid input writes nothing. It
// checks ctx as it goes; on cancellation it returns ctx's error after a
// partial write, which callers writing to a file must discard (Save does).
func Write(ctx context.Context, w io.Writer, tensors []Tensor, meta map[string]string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("checkpoint: write: %w", err)
	}
	p, err := prepare(tensors, meta)
	if err != nil {
		return 0, err
	}
	n, err := p.writeTo(ctx, w)
	if err != nil {
		return n, fmt.Errorf("checkpoint: write: %w", err)
	}
	return n, nil
}

// wrapFileWriter lets tests put a failing writer between Save and its
// temporary file, to check what a failure in the middle of a write leaves.
var wrapFileWriter = func(w io.Writer) io.Writer { return w }

// Save writes tensors and meta to path as a safetensors file, replacing any
// file there atomically.
//
// Tensors are validated first (non-empty UTF-8 names not starting with "__",
// no duplicates, shape product equal to len(Data); ErrInvalidTensor), then
// written in their DType (F32 unless set) in name order, back to back, after a header padded with
// spaces to a multiple of 8 bytes, so equal inputs always give equal bytes.
// meta is stored as the "__metadata__" object with sorted keys; nil and empty
// meta both store none.
//
// The bytes go to a temporary file in the same directory, which is flushed
// to disk (fsync), closed and renamed over path; then the directory itself
// is synced so the rename survives a power cut. Until the rename, path keeps
// its old content; on any error, including ctx being cancelled, the
// temporary file is removed and path is untouched. A replaced file keeps its
// permission bits; a new one gets 0644.
func Save(ctx context.Context, path string, tensors []Tensor, meta map[string]string) (err error) {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("checkpoint: save %s: %w", path, err)
	}
	p, err := prepare(tensors, meta)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("checkpoint: save %s: %w", path, err)
		}
	}()

	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
		mode = fi.Mode().Perm()
	}
	return atomicfile.Write(ctx, path, mode, func(w io.Writer) error {
		bw := bufio.NewWriterSize(wrapFileWriter(w), chunkSize)
		if _, err := p.writeTo(ctx, bw); err != nil {
			return err
		}
		return bw.Flush()
	})
}
