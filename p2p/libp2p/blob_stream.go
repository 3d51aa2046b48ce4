package libp2p

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	blocks "github.com/ipfs/go-block-format"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	msmux "github.com/multiformats/go-multistream"

	"github.com/psyche-go/psyche/p2p"
)

// The blob stream (p2p/blob_protocol.go) is the fast path of Fetch: one
// stream from the announcer, every block read straight into its place in
// the payload, hashed by a second goroutine while the next one is read, and
// stored (so that bitswap serves it on) once it matches its digest.
// Whatever the stream does not deliver is left to bitswap.

// errStalled ends a stream whose peer sent a block slower than the node's
// minimum fetch rate allows.
var errStalled = errors.New("p2p: peer too slow, stream abandoned")

// clock is the time the blob stream's stall timer and each fetch attempt's
// timeout run on: the real one, or a controlled one in tests.
type clock interface {
	// AfterFunc runs f after d, unless stop is called first (stop reports
	// whether it was in time).
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type realClock struct{}

func (realClock) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// streamChunk is the most one read of a blob stream asks for: the unit its
// stall timer allows time for.
const streamChunk = 64 << 10

// watchedReader reads a blob stream under a stall timer: every read of n
// bytes (at most streamChunk) must return within readDeadline(n), or the
// stream is reset and the reader reports errStalled from then on. A peer
// that stops sending is given up after the stall allowance; one that sends,
// however slowly, is bounded by the attempt's timeout, which grows with the
// blob's size.
type watchedReader struct {
	r       io.Reader
	cfg     *config
	reset   func()
	stalled atomic.Bool
}

func (w *watchedReader) Read(p []byte) (int, error) {
	if w.stalled.Load() {
		return 0, errStalled
	}
	if len(p) > streamChunk {
		p = p[:streamChunk]
	}
	stop := w.cfg.clock.AfterFunc(w.cfg.readDeadline(len(p)), func() {
		w.stalled.Store(true)
		w.reset()
	})
	n, err := w.r.Read(p)
	stop()
	if err != nil && w.stalled.Load() {
		err = errStalled
	}
	return n, err
}

// readDeadline is how long a read of n bytes may take on a blob stream: the
// stall allowance plus n at the minimum rate.
func (c *config) readDeadline(n int) time.Duration {
	return c.stallTimeout + time.Duration(float64(n)/float64(c.minRate)*float64(time.Second))
}

// attemptTimeout bounds one fetch attempt of size bytes: the fetch timeout
// plus size at the minimum rate, so that large blobs are not cut short and
// small ones do not wait long for a dead peer.
func (c *config) attemptTimeout(size uint64) time.Duration {
	return c.fetchTimeout + time.Duration(float64(size)/float64(c.minRate)*float64(time.Second))
}

// serveBlob answers a blob request with the blocks the node holds.
func (n *Node) serveBlob(s network.Stream) {
	defer s.Close()
	_ = s.SetReadDeadline(time.Now().Add(pullTimeout))
	b, err := io.ReadAll(io.LimitReader(s, p2p.MaxBlobRequestSize+1))
	if err != nil {
		s.Reset()
		return
	}
	req, err := p2p.DecodeBlobRequest(b)
	if err != nil {
		s.Reset()
		return
	}
	ctx := n.life
	var buf []byte
	for i, w := range req.Blocks {
		if n.cfg.serveHook != nil {
			n.cfg.serveHook(i, w.Hash)
		}
		var data []byte
		c := cidOf(w.Hash)
		if b, served, err := n.bstore.readServed(c, &buf); served {
			if err == nil && len(b) == int(w.Len) {
				data = b
			}
		} else if blk, err := n.bstore.Get(ctx, c); err == nil && len(blk.RawData()) == int(w.Len) {
			data = blk.RawData()
		}
		// A reader that stops reading holds this goroutine no longer than
		// a fetch attempt of the block would last (a hang guard: the
		// fetcher's stall timer is what judges speed).
		_ = s.SetWriteDeadline(time.Now().Add(n.cfg.attemptTimeout(uint64(w.Len))))
		if err := p2p.WriteBlobBlock(s, data); err != nil {
			s.Reset()
			return
		}
	}
}

// streamBlocks asks from for the blocks of ref at idx and reads them into
// out (the whole payload, ref.Size bytes). Each block is checked against its
// digest, then stored and marked in have; blocks the peer does not hold, or
// that come too slowly or wrong, are left unmarked for bitswap. It returns
// the number of blocks received and why the stream ended early, if it did.
func (n *Node) streamBlocks(ctx context.Context, from peer.ID, ref p2p.BlobRef, idx []int, out []byte, have []bool) (int, error) {
	req := p2p.WantsOf(ref, idx)
	return n.streamInto(ctx, from, req, streamSink{
		buf: func(k int) []byte {
			off := uint64(idx[k]) * p2p.BlockSize
			return out[off : off+uint64(req.Blocks[k].Len)]
		},
		reading: func(k int) {
			if n.cfg.readHook != nil {
				n.cfg.readHook(idx[k])
			}
		},
		arrived: func(k int, _ []byte) error { have[idx[k]] = true; return nil },
		keep:    true,
	})
}

// streamSink says where streamInto puts the blocks it reads.
type streamSink struct {
	// buf is where block k is read: exactly req.Blocks[k].Len bytes, a
	// length the requester chose, never the peer.
	buf func(k int) []byte
	// reading, if not nil, is called before block k is read.
	reading func(k int)
	// arrived takes block k (in buf(k)) once it is checked against its
	// digest; an error ends the stream.
	arrived func(k int, b []byte) error
	// keep stores the checked blocks too, so that bitswap serves them on.
	keep bool
}

// streamInto asks from for the blocks of req and reads each straight into
// its buffer (sink.buf). Each block is checked against its digest, then
// stored if sink.keep and passed to sink.arrived, from a goroutine of its
// own that hashes each block while the next one is read. Blocks the peer
// does not hold, or that come too slowly or wrong, are not passed on. It
// returns the number of blocks received and why the stream ended early, if
// it did.
func (n *Node) streamInto(ctx context.Context, from peer.ID, req p2p.BlobRequest, sink streamSink) (int, error) {
	s, err := n.bulkStream(ctx, from, p2p.BlobProtocol)
	if err != nil {
		return 0, err
	}
	raw, err := req.MarshalBinary()
	if err != nil {
		s.Reset()
		return 0, err
	}
	if _, err := s.Write(raw); err != nil {
		s.Reset()
		return 0, err
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return 0, err
	}
	// Ending the context ends the stream (and unblocks its reads).
	stopCtx := context.AfterFunc(ctx, func() { s.Reset() })
	defer stopCtx()

	// The reader hands each block to the verifier, which hashes it while
	// the next one is read.
	type block struct {
		k   int // index in req
		buf []byte
	}
	verify := make(chan block, 4)
	var (
		wg       sync.WaitGroup
		got      int
		verifErr error
		bad      atomic.Bool
	)
	k2p := keyString(from)
	wg.Go(func() {
		var batch []blocks.Block
		flush := func() {
			if len(batch) == 0 {
				return
			}
			if err := n.store(n.life, batch); err != nil {
				n.log.Debug("store streamed blocks", "err", err)
			}
			batch = batch[:0]
		}
		for a := range verify {
			if bad.Load() {
				continue
			}
			w := req.Blocks[a.k]
			if err := p2p.VerifyBlock(w, a.buf); err != nil {
				verifErr = err
				bad.Store(true)
				s.Reset()
				continue
			}
			b, err := blocks.NewBlockWithCid(a.buf, cidOf(w.Hash))
			if err != nil {
				verifErr = err
				bad.Store(true)
				s.Reset()
				continue
			}
			if err := sink.arrived(a.k, a.buf); err != nil {
				verifErr = err
				bad.Store(true)
				s.Reset()
				continue
			}
			got++
			if k2p != "" {
				n.m.BlocksFrom.WithLabelValues(k2p).Inc()
			}
			if !sink.keep {
				continue
			}
			batch = append(batch, b)
			if len(batch) >= 8 {
				flush()
			}
		}
		flush()
	})

	var readErr error
	r := &watchedReader{r: s, cfg: n.cfg, reset: func() { s.Reset() }}
	for k, w := range req.Blocks {
		if sink.reading != nil {
			sink.reading(k)
		}
		buf := sink.buf(k)
		held, err := p2p.ReadBlobBlock(r, w, buf)
		if err == nil && held {
			verify <- block{k: k, buf: buf}
		}
		if r.stalled.Load() {
			// Too slow, whether or not this block made it in time.
			err = fmt.Errorf("%w: block %d of %d bytes", errStalled, k, w.Len)
		}
		if err != nil {
			readErr = err
			break
		}
		if bad.Load() {
			break
		}
	}
	close(verify)
	wg.Wait()
	if verifErr != nil {
		return got, verifErr
	}
	if readErr != nil {
		s.Reset()
		if ctx.Err() != nil {
			return got, ctx.Err()
		}
		return got, readErr
	}
	s.Close()
	return got, nil
}

// bulkStream opens a stream for proto to p, on a direct TCP connection when
// there is one. Peers are often connected twice (TCP and QUIC, dialled from
// both sides), and the swarm picks whichever connection carries more
// streams; for bulk data quic-go costs several times TCP's CPU per byte
// (one UDP datagram per packet), which on a loaded machine halves a round's
// throughput. Without a TCP connection, any will do.
func (n *Node) bulkStream(ctx context.Context, p peer.ID, proto protocol.ID) (network.Stream, error) {
	for _, c := range n.host.Network().ConnsToPeer(p) {
		if c.IsClosed() || c.Stat().Limited || c.ConnState().Transport != "tcp" {
			continue
		}
		s, err := c.NewStream(ctx)
		if err != nil {
			break
		}
		if err := s.SetProtocol(proto); err != nil {
			s.Reset()
			break
		}
		return &lazyStream{Stream: s, rw: msmux.NewMSSelect(s, proto)}, nil
	}
	return n.host.NewStream(ctx, p, proto)
}

// lazyStream negotiates its protocol lazily, as the host's own streams do:
// the multistream header goes out with the first write and the answer is
// read before the first read, so a request costs no extra round trip.
type lazyStream struct {
	network.Stream
	rw msmux.LazyConn
}

func (s *lazyStream) Read(b []byte) (int, error)  { return s.rw.Read(b) }
func (s *lazyStream) Write(b []byte) (int, error) { return s.rw.Write(b) }
func (s *lazyStream) Close() error                { return s.rw.Close() }

func (s *lazyStream) CloseWrite() error {
	_ = s.rw.Flush()
	return s.Stream.CloseWrite()
}

// keyString is a peer's key as the metrics label it (empty if the peer id
// is not an ed25519 key).
func keyString(p peer.ID) string {
	if k, ok := pubkeyOf(p); ok {
		return k.String()
	}
	return ""
}
