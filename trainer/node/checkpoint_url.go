package node

import (
	"strings"

	"bufio"
	"context"
	"io"

	"github.com/psyche-go/psyche/coordinator"

	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// loadURL loads the run's checkpoint source (as runmodel.ParseSource reads
// it): fresh weights drawn from a seed (seed:N, the run's model built here,
// the same on every trainer), a file:// path on this machine, or an
// http(s):// URL read with range requests (the data provider's HTTP source,
// with its retries), streamed into the decoder, which accepts no more
// tensor bytes than the run's model has.
func (n *Node) loadURL(ctx context.Context, url string, cfg runmodel.Config) (runmodel.Model, error) {
	src, err := runmodel.ParseSource(url)
	if err != nil {
		return nil, err
	}
	switch src.Kind {
	case runmodel.FromSeed:
		return runmodel.New(cfg, src.Seed, n.cfg.kernels)
	case runmodel.FromFile:
		return runmodel.Load(ctx, src.Path, n.cfg.kernels)
	}
	// runmodel.FromHTTP. A Llama run's URL that does not name a
	// .safetensors file is a Hugging Face directory.
	if cfg.Arch == coordinator.ArchLlama && !strings.HasSuffix(strings.SplitN(url, "?", 2)[0], ".safetensors") {
		return llama.LoadHF(ctx, llama.HTTPDir{URL: url, Opts: n.cfg.dataOpts}, n.cfg.kernels)
	}
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
	return runmodel.FromCheckpoint(ck, n.cfg.kernels)
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
