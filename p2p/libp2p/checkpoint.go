package libp2p

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// ShareCheckpoint serves src to joiners of epoch until the next
// ShareCheckpoint (or Close), and returns its manifest id, which is what a
// joiner needs, offering it to joiners of epoch (FindCheckpoint). It reads
// src once to digest its blocks, then serves each block by reading it from
// src when a peer asks (servedStore): the node holds the manifest, not the
// model. It takes src over and closes it when done serving it, or at once
// when sharing fails.
func (n *Node) ShareCheckpoint(ctx context.Context, epoch uint32, src p2p.CheckpointSource) (id coordinator.Hash, err error) {
	served := false
	defer func() {
		if !served {
			src.Close()
		}
	}()
	if err := n.alive(); err != nil {
		return id, err
	}
	m, starts, err := p2p.Manifest(ctx, src)
	if err != nil {
		return id, err
	}
	raw, err := m.MarshalBinary()
	if err != nil {
		return id, err
	}
	mb, mh := split(raw)
	// Only the manifest's blocks live in the store; the tensors' are read
	// from src.
	n.setCheckpoint(slices.Clone(mh))
	n.bstore.serve(src, &m, starts)
	served = true
	if err := n.store(ctx, mb); err != nil {
		return id, err
	}
	n.offer(epoch, mh[0])
	return mh[0], nil
}

// setCheckpoint replaces the blocks held for the shared checkpoint.
func (n *Node) setCheckpoint(hs []coordinator.Hash) {
	n.mu.Lock()
	for _, h := range hs {
		n.refs[h]++
	}
	drop := n.unref(n.ckptRefs)
	n.ckptRefs = hs
	n.mu.Unlock()
	n.deleteBlocks(drop)
}

// FetchCheckpoint writes the checkpoint whose manifest id is id into into.
// It dials the given peers, fetches the manifest, then streams the blocks
// from those peers (BlobProtocol, the fast path of Fetch too): the missing
// blocks, in chunks of checkpointChunk that the peers' streams take in turn,
// each checked against its digest and written at its place in the file
// through a buffer of one block (the model never sits in this process's
// memory). Whatever the streams do not deliver (a peer left, is too slow,
// lacks a block or sent a wrong one) is fetched over one bitswap session
// with at most WithCheckpointConcurrency requests in flight, which spreads
// the wants over every connected peer that has the blocks; a request that
// fails is retried with backoff. Blocks already received are kept, so
// nothing is fetched twice, and a block the checkpoint holds at several
// places is copied within the file.
func (n *Node) FetchCheckpoint(ctx context.Context, id coordinator.Hash, from []coordinator.Pubkey, into *p2p.CheckpointFile) error {
	if err := n.alive(); err != nil {
		return err
	}
	n.dialAll(ctx, from, "dial checkpoint peer")
	get := n.verifiedBlocks(ctx)
	raw, err := get(ctx, id)
	if err != nil {
		return fmt.Errorf("p2p: checkpoint manifest: %w", err)
	}
	m, err := p2p.DecodeCheckpointManifest(raw)
	if err != nil {
		return err
	}
	if err := m.Match(into.Specs()); err != nil {
		return err
	}
	blocks := distinctBlocks(&m)
	// Hold the blocks from the start, so that a GC running meanwhile cannot
	// take what bitswap has already received; the streams write theirs
	// straight into the file.
	n.setCheckpoint(append([]coordinator.Hash{id}, blocks...))
	// Only the manifest once the blocks are in the file (ShareCheckpoint
	// serves them from it).
	defer n.setCheckpoint([]coordinator.Hash{id})

	// Where each tensor starts in the file: the manifest matched the specs
	// the file was made for.
	starts := make([]uint64, len(m.Tensors))
	have := make([][]bool, len(m.Tensors))
	off := uint64(0)
	for t, e := range m.Tensors {
		starts[t], off = off, off+e.Blob.Size
		have[t] = make([]bool, len(e.Blob.Blocks))
	}
	at := func(p blockPlace) int64 { return int64(starts[p.t] + uint64(p.i)*p2p.BlockSize) }
	prog := &progress{total: len(blocks), f: n.cfg.ckptProgress, m: n.m}
	// The first place of every distinct block that is not held already;
	// its other places are filled from the file or the store at the end.
	var todo []blockPlace
	seen := map[coordinator.Hash]bool{}
	for t, e := range m.Tensors {
		for i, h := range e.Blob.Blocks {
			if seen[h] {
				continue
			}
			seen[h] = true
			if ok, _ := n.bstore.Has(ctx, cidOf(h)); ok {
				prog.add()
				continue
			}
			todo = append(todo, blockPlace{t, i})
		}
	}
	if !n.cfg.noStream && len(todo) > 0 {
		n.streamCheckpoint(ctx, &m, from, todo, into, at, have, prog)
	}
	var rest []coordinator.Hash
	for _, p := range todo {
		if !have[p.t][p.i] {
			rest = append(rest, m.Tensors[p.t].Blob.Blocks[p.i])
		}
	}
	// A new session: the manifest's may know only a peer that has left
	// since, while a new one asks every connected peer first.
	if err := n.fetchAll(ctx, rest, n.verifiedBlocks(ctx), prog); err != nil {
		return err
	}
	if err := n.fillFile(ctx, &m, into, at, have); err != nil {
		return err
	}
	into.Verified(m)
	return nil
}

// fillFile writes every place of m that the streams did not: a copy of the
// same block written at another place of the file, or else the block from
// the store (where bitswap put it, or where it was held before), checked
// again against its digest and its length.
func (n *Node) fillFile(ctx context.Context, m *p2p.CheckpointManifest, into *p2p.CheckpointFile, at func(blockPlace) int64, have [][]bool) error {
	written := map[coordinator.Hash]int64{}
	for t, e := range m.Tensors {
		for i, h := range e.Blob.Blocks {
			if have[t][i] {
				written[h] = at(blockPlace{t, i})
			}
		}
	}
	buf := make([]byte, p2p.BlockSize)
	for t, e := range m.Tensors {
		for i, h := range e.Blob.Blocks {
			if have[t][i] {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			b := buf[:p2p.BlockLen(e.Blob.Size, i)]
			if from, ok := written[h]; ok {
				if _, err := into.ReadAt(b, from); err != nil {
					return fmt.Errorf("p2p: tensor %q: %w", e.Name, err)
				}
			} else {
				blk, err := n.storedBlock(ctx, e.Blob, i)
				if err != nil {
					return fmt.Errorf("p2p: tensor %q: %w", e.Name, err)
				}
				copy(b, blk)
			}
			if _, err := into.WriteAt(b, at(blockPlace{t, i})); err != nil {
				return fmt.Errorf("p2p: tensor %q: %w", e.Name, err)
			}
			have[t][i] = true
			written[h] = at(blockPlace{t, i})
		}
	}
	return nil
}

// checkpointChunk is the most blocks one checkpoint stream asks for: large
// enough that a stream's round trip is nothing beside its transfer, small
// enough that the peers share the work and that a peer that leaves takes
// little unfinished with it. A small checkpoint is cut finer, so that every
// stream has a share.
const checkpointChunk = 64

// checkpointStreamsPerPeer is how many checkpoint streams run to one peer at
// a time: while one waits for its first block (a round trip), the other is
// moving bytes.
const checkpointStreamsPerPeer = 2

// errNotHeld ends the checkpoint streams to a peer that lacks blocks: it
// may serve another checkpoint, which is no misconduct.
var errNotHeld = errors.New("p2p: peer does not hold the blocks")

// errWriteCheckpoint ends a checkpoint stream whose block this node could
// not write to its file: no fault of the peer's.
var errWriteCheckpoint = errors.New("p2p: writing a checkpoint block")

// blockPlace is block i of tensor t of a manifest.
type blockPlace struct{ t, i int }

// progress counts the verified blocks of a checkpoint fetch and reports
// each to the progress callback.
type progress struct {
	mu    sync.Mutex
	done  int
	total int
	f     func(done, total int)
	m     *Metrics
}

func (p *progress) add() {
	p.m.CheckpointBlocks.Inc()
	p.mu.Lock()
	p.done++
	d := p.done
	p.mu.Unlock()
	if p.f != nil {
		p.f(d, p.total)
	}
}

// streamCheckpoint streams the blocks at todo from the connected peers of
// from, checkpointStreamsPerPeer streams to each, every stream taking the
// next chunk of checkpointChunk blocks; a peer whose stream fails (it left,
// stalled, lacks a block or sent a wrong one) takes no more. Each verified
// block is written at its place in the file (at) and marked in have; what
// is left unmarked is for bitswap.
func (n *Node) streamCheckpoint(ctx context.Context, m *p2p.CheckpointManifest, from []coordinator.Pubkey, todo []blockPlace, into *p2p.CheckpointFile, at func(blockPlace) int64, have [][]bool, prog *progress) {
	type source struct {
		k coordinator.Pubkey
		p peer.ID
	}
	var peers []source
	for _, k := range from {
		p, err := peerIDOf(k)
		if err != nil || p == n.host.ID() || n.host.Network().Connectedness(p) != network.Connected {
			continue
		}
		peers = append(peers, source{k, p})
	}
	if len(peers) == 0 {
		return
	}
	streams := len(peers) * checkpointStreamsPerPeer
	size := max(1, min(checkpointChunk, (len(todo)+streams-1)/streams))
	chunks := make(chan []blockPlace, (len(todo)+size-1)/size)
	for lo := 0; lo < len(todo); lo += size {
		chunks <- todo[lo:min(lo+size, len(todo))]
	}
	close(chunks)
	var wg sync.WaitGroup
	for _, src := range peers {
		k, p := src.k, src.p
		var failed atomic.Bool
		for range checkpointStreamsPerPeer {
			wg.Go(func() {
				for chunk := range chunks {
					if failed.Load() || ctx.Err() != nil {
						return // the chunk's blocks stay for bitswap
					}
					if err := n.streamChunk(ctx, p, m, chunk, into, at, have, prog); err != nil {
						failed.Store(true)
						if ctx.Err() == nil && !errors.Is(err, errNotHeld) && !errors.Is(err, errWriteCheckpoint) {
							n.peerError(k, "checkpoint stream", err)
						}
						return
					}
				}
			})
		}
	}
	wg.Wait()
}

// streamChunk streams the blocks at chunk from p, within the time a fetch
// attempt of their size is allowed, into the file, each through a block
// buffer of the pool.
func (n *Node) streamChunk(ctx context.Context, p peer.ID, m *p2p.CheckpointManifest, chunk []blockPlace, into *p2p.CheckpointFile, at func(blockPlace) int64, have [][]bool, prog *progress) error {
	req := p2p.BlobRequest{Blocks: make([]p2p.BlockWant, len(chunk))}
	var size uint64
	for k, pl := range chunk {
		ref := m.Tensors[pl.t].Blob
		w := p2p.BlockWant{Hash: ref.Blocks[pl.i], Len: uint32(p2p.BlockLen(ref.Size, pl.i))}
		req.Blocks[k] = w
		size += uint64(w.Len)
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := n.cfg.clock.AfterFunc(n.cfg.attemptTimeout(size), func() { cancel(errAttemptTimedOut) })
	defer stop()
	got, err := n.streamInto(actx, p, req, streamSink{
		buf: func(k int) []byte { return getBlockBuf()[:req.Blocks[k].Len] },
		arrived: func(k int, b []byte) error {
			defer putBlockBuf(b)
			if _, err := into.WriteAt(b, at(chunk[k])); err != nil {
				return fmt.Errorf("%w: %w", errWriteCheckpoint, err)
			}
			have[chunk[k].t][chunk[k].i] = true
			prog.add()
			return nil
		},
	})
	if err == nil && got < len(chunk) {
		err = fmt.Errorf("%w: %d of %d blocks", errNotHeld, got, len(chunk))
	}
	if err != nil && errors.Is(context.Cause(actx), errAttemptTimedOut) {
		err = fmt.Errorf("%w: %w", errAttemptTimedOut, err)
	}
	return err
}

// blockBufs are block-sized buffers that a checkpoint's streams read into
// and give back once the block is written to its file.
var blockBufs = sync.Pool{New: func() any { b := make([]byte, p2p.BlockSize); return &b }}

func getBlockBuf() []byte { return *blockBufs.Get().(*[]byte) }

func putBlockBuf(b []byte) {
	b = b[:cap(b)]
	blockBufs.Put(&b)
}

// dialAll connects to the peers not connected yet; a failure is counted
// against the peer and otherwise ignored (another peer may serve).
func (n *Node) dialAll(ctx context.Context, peers []coordinator.Pubkey, what string) {
	for _, k := range peers {
		p, err := peerIDOf(k)
		if err != nil || p == n.host.ID() || n.host.Network().Connectedness(p) == network.Connected {
			continue
		}
		if err := n.host.Connect(ctx, peer.AddrInfo{ID: p}); err != nil {
			n.peerError(k, what, err)
		}
	}
}

// blockGetter returns a block whose BlockDigest is h.
type blockGetter func(ctx context.Context, h coordinator.Hash) ([]byte, error)

// verifiedBlocks gets blocks from the local store or, over one bitswap
// session (which spreads the wants over the peers that have the blocks),
// from peers, with retries; every block is checked against its digest
// before it is stored or returned.
func (n *Node) verifiedBlocks(ctx context.Context) blockGetter {
	sess := n.bs.NewSession(ctx)
	return func(ctx context.Context, h coordinator.Hash) ([]byte, error) {
		if b, err := n.bstore.Get(ctx, cidOf(h)); err == nil && p2p.BlockDigest(b.RawData()) == h {
			return b.RawData(), nil
		}
		var data []byte
		err := n.retrying(ctx, n.cfg.attemptTimeout(p2p.BlockSize), func(actx context.Context) (bool, error) {
			b, err := sess.GetBlock(actx, cidOf(h))
			if err != nil {
				return false, err
			}
			if p2p.BlockDigest(b.RawData()) != h {
				return false, fmt.Errorf("%w: %x", p2p.ErrBlockMismatch, h[:8])
			}
			if err := n.bstore.Put(ctx, b); err != nil {
				return true, err
			}
			data = b.RawData()
			return false, nil
		})
		if errors.Is(err, p2p.ErrFetchFailed) {
			return nil, fmt.Errorf("block %x: %w", h[:8], err)
		}
		return data, err
	}
}

// distinctBlocks lists the manifest's blocks, each once, in order.
func distinctBlocks(m *p2p.CheckpointManifest) []coordinator.Hash {
	var out []coordinator.Hash
	seen := map[coordinator.Hash]bool{}
	for _, t := range m.Tensors {
		for _, h := range t.Blob.Blocks {
			if !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	return out
}

// fetchAll gets every block with at most WithCheckpointConcurrency requests
// in flight, counting each in prog; the first failure stops the rest.
func (n *Node) fetchAll(ctx context.Context, blocks []coordinator.Hash, get blockGetter, prog *progress) error {
	if len(blocks) == 0 {
		return ctx.Err()
	}
	work := make(chan coordinator.Hash)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(n.cfg.ckptConcurrency, len(blocks)) {
		wg.Go(func() {
			for h := range work {
				if _, err := get(wctx, h); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					continue
				}
				prog.add()
			}
		})
	}
feed:
	for _, h := range blocks {
		select {
		case work <- h:
		case <-wctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
