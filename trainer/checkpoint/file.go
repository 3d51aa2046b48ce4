package checkpoint

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// File is a checkpoint file opened for reading its tensors a range at a
// time: its header is read and validated as Load validates it, and no data
// is read until asked for, so a model of gigabytes can be handed on (to an
// engine that holds it elsewhere, to a hash) without being held whole.
type File struct {
	path    string
	f       *os.File
	data    int64 // where the data section starts
	entries map[string]entry
	infos   []TensorInfo
	meta    map[string]string
}

// Open opens the checkpoint file at path.
func (l Limits) Open(path string) (*File, error) {
	f, size, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	return l.open(f, size, path)
}

// Spool copies a checkpoint of size bytes from r (a download) into a file
// that has no name, unlinked at once so that closing the File frees its
// space and a crash leaves nothing behind, and opens it: a remote model of
// gigabytes lands on disk, not in memory. A size beyond the limits is
// refused before anything is copied; name says where it came from.
func (l Limits) Spool(r io.Reader, size int64, name string) (*File, error) {
	maxHeader := l.MaxHeaderSize
	if maxHeader <= 0 {
		maxHeader = DefaultMaxHeaderSize
	}
	if l.MaxDataSize > 0 && size > lengthSize+maxHeader+l.MaxDataSize {
		return nil, naming(name, formatErr(ErrTooLarge, "%d bytes exceed the limit of %d", size, lengthSize+maxHeader+l.MaxDataSize))
	}
	f, err := os.CreateTemp("", "psyche-download-*")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: a file for %s: %w", name, err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("checkpoint: a file for %s: %w", name, err)
	}
	n, err := io.Copy(f, io.LimitReader(r, size))
	if err == nil && n < size {
		err = formatErr(ErrTruncated, "%d bytes of %d", n, size)
	}
	if err != nil {
		f.Close()
		return nil, naming(name, fmt.Errorf("checkpoint: %s: %w", name, err))
	}
	return l.open(f, size, name)
}

// open reads and validates the header of f, a checkpoint of size bytes.
func (l Limits) open(f *os.File, size int64, name string) (*File, error) {
	entries, meta, dataSize, err := l.readHeader(io.NewSectionReader(f, 0, size), size)
	if err != nil {
		f.Close()
		return nil, naming(name, err)
	}
	c := &File{path: name, f: f, data: size - dataSize, entries: make(map[string]entry, len(entries)), meta: meta}
	for _, e := range entries {
		c.entries[e.name] = e
		c.infos = append(c.infos, TensorInfo{Name: e.name, Shape: e.shape, DType: e.dtypeName})
	}
	slices.SortFunc(c.infos, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) })
	return c, nil
}

// Name says where the file came from: its path, or what it was
// downloaded from.
func (c *File) Name() string { return c.path }

// Tensors lists the file's tensors in name order.
func (c *File) Tensors() []TensorInfo { return c.infos }

// Metadata is the file's "__metadata__" object (empty, not nil, when it
// has none).
func (c *File) Metadata() map[string]string { return c.meta }

// Read decodes values [off, off+len(dst)) of the named tensor, in its
// row-major order, into dst, whatever the dtype it is stored as.
func (c *File) Read(name string, off int, dst []float32) error {
	e, ok := c.entries[name]
	if !ok {
		return wrap(ErrNotFound, "%q", name)
	}
	if off < 0 || off+len(dst) > e.numel {
		return fmt.Errorf("checkpoint: %s: values [%d, %d) of tensor %q, which has %d", c.path, off, off+len(dst), name, e.numel)
	}
	buf := make([]byte, min(chunkSize, len(dst)*e.dtype.size))
	per := len(buf) / max(e.dtype.size, 1)
	at := c.data + int64(e.begin) + int64(off)*int64(e.dtype.size)
	for rest := dst; len(rest) > 0; {
		k := min(len(rest), per)
		chunk := buf[:k*e.dtype.size]
		if _, err := c.f.ReadAt(chunk, at); err != nil {
			return fmt.Errorf("checkpoint: %s: tensor %q: %w", c.path, name, err)
		}
		e.dtype.decode(rest[:k], chunk)
		rest, at = rest[k:], at+int64(len(chunk))
	}
	return nil
}

// Close closes the file.
func (c *File) Close() error { return c.f.Close() }
