package node

import (
	"bufio"
	"context"
	"io"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// loadURL loads the run's checkpoint source (as runmodel.ParseSource reads
// it): fresh weights drawn from a seed (seed:N, the run's model built here,
// the same on every trainer), a file:// path on this machine, or an
// http(s):// URL read with range requests (the data provider's HTTP source,
// with its retries), streamed into the decoder, which accepts no more
// tensor bytes than the run's model has.
func (n *Node) loadURL(ctx context.Context, url string, cfg gpt.Config) (*gpt.Model, error) {
	src, err := runmodel.ParseSource(url)
	if err != nil {
		return nil, err
	}
	switch src.Kind {
	case runmodel.FromSeed:
		return gpt.New(cfg, src.Seed, n.cfg.kernels)
	case runmodel.FromFile:
		return gpt.Load(src.Path, n.cfg.kernels)
	}
	// runmodel.FromHTTP
	hs, err := data.NewHTTPSource(url, n.cfg.dataOpts...)
	if err != nil {
		return nil, err
	}
	defer hs.Close()
	size, err := hs.Size(ctx)
	if err != nil {
		return nil, err
	}
	lim := checkpoint.Limits{MaxDataSize: 4 * int64(cfg.NumParams())}
	ck, err := lim.Read(bufio.NewReaderSize(&sourceReader{ctx: ctx, src: hs, size: size}, 4<<20), size)
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
