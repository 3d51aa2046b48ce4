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
	return &httpFile{ReadCloser: data.ReadAhead(ctx, src, size, 4<<20, 4), src: src}, size, nil
}

func (d HTTPDir) String() string { return strings.TrimSuffix(d.URL, "/") }

// httpFile reads a remote file front to back, 4 MiB range requests with up
// to 4 in flight (data.ReadAhead).
type httpFile struct {
	io.ReadCloser
	src *data.HTTPSource
}

func (f *httpFile) Close() error {
	f.ReadCloser.Close()
	return f.src.Close()
}
