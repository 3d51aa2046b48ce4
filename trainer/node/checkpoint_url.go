package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
)

// loadURL loads the run's checkpoint source: a file:// path on this machine,
// or an http(s):// URL read with range requests (the data provider's HTTP
// source, with its retries), streamed into the decoder, which accepts no
// more tensor bytes than the run's model has.
func (n *Node) loadURL(ctx context.Context, url string, cfg gpt.Config) (*gpt.Model, error) {
	if path, ok := strings.CutPrefix(url, "file://"); ok {
		return gpt.Load(path, n.cfg.kernels)
	}
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("unsupported checkpoint source (file://, http:// and https:// are)")
	}
	src, err := data.NewHTTPSource(url, n.cfg.dataOpts...)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	size, err := src.Size(ctx)
	if err != nil {
		return nil, err
	}
	lim := checkpoint.Limits{MaxDataSize: 4 * int64(cfg.NumParams())}
	ck, err := lim.Read(bufio.NewReaderSize(&sourceReader{ctx: ctx, src: src, size: size}, 4<<20), size)
	if err != nil {
		return nil, err
	}
	return gpt.FromCheckpoint(ck, n.cfg.kernels)
}

// sourceReader reads a data source front to back.
type sourceReader struct {
	ctx  context.Context
	src  *data.HTTPSource
	off  int64
	size int64
}

func (r *sourceReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.size-r.off)]
	if err := r.src.ReadAt(r.ctx, p, r.off); err != nil {
		return 0, err
	}
	r.off += int64(len(p))
	return len(p), nil
}
