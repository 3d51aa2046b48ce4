package llama

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/psyche-go/psyche/trainer/data"
)

// HTTPDir is a checkpoint directory served over http(s): each file is read
// with range requests (and the retries) of the data provider's HTTP source.
type HTTPDir struct {
	URL  string        // the directory; files are URL + "/" + name
	Opts []data.Option // HTTP client, retries, timeouts
}

// Open implements Dir. A 404 or 410 wraps fs.ErrNotExist, so LoadHF can
// tell a sharded directory (no model.safetensors) from a failing server.
func (d HTTPDir) Open(ctx context.Context, name string) (io.ReadCloser, int64, error) {
	src, err := data.NewHTTPSource(strings.TrimSuffix(d.URL, "/")+"/"+name, d.Opts...)
	if err != nil {
		return nil, 0, err
	}
	size, err := src.Size(ctx)
	if err != nil {
		src.Close()
		if errors.Is(err, data.ErrNotFound) {
			return nil, 0, fmt.Errorf("%s: %w (%w)", name, fs.ErrNotExist, err)
		}
		return nil, 0, err
	}
	return &httpFile{ctx: ctx, src: src, size: size}, size, nil
}

func (d HTTPDir) String() string { return strings.TrimSuffix(d.URL, "/") }

// httpFile reads a remote file front to back in the reader's chunks (LoadHF
// wraps it in a 4 MiB bufio.Reader, so each range request is that large).
type httpFile struct {
	ctx       context.Context
	src       *data.HTTPSource
	off, size int64
}

func (f *httpFile) Read(p []byte) (int, error) {
	if f.off >= f.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), f.size-f.off)]
	if err := f.src.ReadAt(f.ctx, p, f.off); err != nil {
		return 0, err
	}
	f.off += int64(len(p))
	return len(p), nil
}

func (f *httpFile) Close() error { return f.src.Close() }
