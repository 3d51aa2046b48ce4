package data

import (
	"context"
	"io"
)

// RangeReader reads a byte range of a remote file (HTTPSource does).
type RangeReader interface {
	ReadAt(ctx context.Context, p []byte, off int64) error
}

// ReadAhead reads src's first size bytes front to back as chunk-sized range
// requests, up to workers of them in flight at once, delivered in order: a
// checkpoint streams at what several connections carry, not at one
// connection's round trips. Close stops the requests in flight.
func ReadAhead(ctx context.Context, src RangeReader, size, chunk int64, workers int) io.ReadCloser {
	ctx, cancel := context.WithCancel(ctx)
	r := &readAhead{cancel: cancel, queue: make(chan chan chunkResult, max(workers-1, 0))}
	go func() {
		defer close(r.queue)
		for off := int64(0); off < size; off += chunk {
			c := make(chan chunkResult, 1) // the fetch never waits for the reader
			select {
			case r.queue <- c:
			case <-ctx.Done():
				return
			}
			go func(off int64) {
				buf := make([]byte, min(chunk, size-off))
				c <- chunkResult{buf, src.ReadAt(ctx, buf, off)}
			}(off)
		}
	}()
	return r
}

type chunkResult struct {
	buf []byte
	err error
}

type readAhead struct {
	cancel context.CancelFunc
	queue  chan chan chunkResult
	cur    []byte
	err    error
}

func (r *readAhead) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		c, ok := <-r.queue
		if !ok {
			r.err = io.EOF
			return 0, io.EOF
		}
		res := <-c
		if res.err != nil {
			r.err = res.err
			r.cancel()
			return 0, res.err
		}
		r.cur = res.buf
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

func (r *readAhead) Close() error {
	r.cancel()
	return nil
}
