package data

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// Source is random access to the bytes of a token file. Implementations are
// safe for concurrent use.
type Source interface {
	// Size returns the file's length in bytes.
	Size(ctx context.Context) (int64, error)
	// ReadAt fills all of p with the bytes at off, or fails; a file that
	// ends before off+len(p) fails with ErrShortRead.
	ReadAt(ctx context.Context, p []byte, off int64) error
	// Close releases what the source holds.
	Close() error
}

// FileSource is a Source reading a local file.
type FileSource struct {
	f    *os.File
	path string
}

var _ Source = (*FileSource)(nil)

// OpenFileSource opens the local file at path. A missing file fails with
// ErrNotFound (which also matches fs.ErrNotExist).
func OpenFileSource(ctx context.Context, path string) (*FileSource, error) {
	if err := ctx.Err(); err != nil {
		return nil, wrapf(err, "open %s", path)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		return nil, wrapf(err, "open %s", path)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, wrapf(err, "open %s", path)
	}
	if info.IsDir() {
		f.Close()
		return nil, fmt.Errorf("data: open %s: is a directory, not a token file", path)
	}
	return &FileSource{f: f, path: path}, nil
}

// Size returns the file's current length.
func (s *FileSource) Size(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, wrapf(err, "stat %s", s.path)
	}
	info, err := s.f.Stat()
	if err != nil {
		return 0, wrapf(err, "stat %s", s.path)
	}
	return info.Size(), nil
}

// ReadAt fills p from offset off. It uses pread, so concurrent calls do not
// interfere.
func (s *FileSource) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := ctx.Err(); err != nil {
		return wrapf(err, "read %s", s.path)
	}
	if off < 0 {
		return fmt.Errorf("data: read %s: negative offset %d", s.path, off)
	}
	n, err := s.f.ReadAt(p, off)
	if n == len(p) {
		return nil // io.ReaderAt may report io.EOF alongside a full read at the end
	}
	if errors.Is(err, io.EOF) {
		want := fmt.Sprintf("wanted bytes [%d, %d)", off, off+int64(len(p)))
		if info, err := s.f.Stat(); err == nil {
			return fmt.Errorf("%w: %s: %s but the file has %d", ErrShortRead, s.path, want, info.Size())
		}
		return fmt.Errorf("%w: %s: %s but the file ends at byte %d", ErrShortRead, s.path, want, off+int64(n))
	}
	return wrapf(err, "read %s", s.path)
}

// Close closes the file.
func (s *FileSource) Close() error { return s.f.Close() }

// String returns the file's path.
func (s *FileSource) String() string { return s.path }

// BytesSource is a Source over bytes in memory (a token file already loaded,
// or one built on the fly, such as the embedded corpus).
type BytesSource struct{ b []byte }

// NewBytesSource returns a Source reading b, which must not change afterwards.
func NewBytesSource(b []byte) *BytesSource { return &BytesSource{b: b} }

// Size implements Source.
func (s *BytesSource) Size(ctx context.Context) (int64, error) { return int64(len(s.b)), ctx.Err() }

// ReadAt implements Source.
func (s *BytesSource) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if off < 0 || off > int64(len(s.b)) || int64(len(p)) > int64(len(s.b))-off {
		return fmt.Errorf("%w: %d bytes at offset %d of %d", ErrShortRead, len(p), off, len(s.b))
	}
	copy(p, s.b[off:])
	return nil
}

// Close implements Source.
func (s *BytesSource) Close() error { return nil }

// String names the source in errors and logs.
func (s *BytesSource) String() string { return fmt.Sprintf("memory (%d bytes)", len(s.b)) }
