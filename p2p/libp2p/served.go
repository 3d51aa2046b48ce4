package libp2p

import (
	"context"
	"fmt"
	"sync"

	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"

	"github.com/ipfs/boxo/blockstore"

	"github.com/psyche-go/psyche/p2p"
)

// servedStore is the node's blockstore with the shared checkpoint's blocks
// laid over it: those are read from the checkpoint's source when a peer asks
// for one (over bitswap or a blob stream), so a model of gigabytes is served
// without being held in memory. Everything else (results, the manifest)
// lives in the blockstore below.
type servedStore struct {
	blockstore.Blockstore

	mu     sync.RWMutex
	src    p2p.CheckpointSource
	blocks map[cid.Cid]servedBlock
}

// servedBlock is where a block lies in the source.
type servedBlock struct {
	off int64
	len int
}

// serve replaces the served checkpoint with src, whose blocks are those m
// lists (each tensor starting at its offset in starts), and closes the
// source served before.
func (s *servedStore) serve(src p2p.CheckpointSource, m *p2p.CheckpointManifest, starts []uint64) {
	at := map[cid.Cid]servedBlock{}
	for t, e := range m.Tensors {
		for i, h := range e.Blob.Blocks {
			at[cidOf(h)] = servedBlock{off: int64(starts[t]) + int64(i)*p2p.BlockSize, len: p2p.BlockLen(e.Blob.Size, i)}
		}
	}
	s.mu.Lock()
	old := s.src
	s.src, s.blocks = src, at
	s.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
}

// stop stops serving the source and closes it.
func (s *servedStore) stop() { s.serve(nil, &p2p.CheckpointManifest{}, nil) }

// lookup is where c lies in the served source, if it is one of its blocks.
func (s *servedStore) lookup(c cid.Cid) (p2p.CheckpointSource, servedBlock, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, ok := s.blocks[c]
	return s.src, b, ok
}

func (s *servedStore) Has(ctx context.Context, c cid.Cid) (bool, error) {
	if _, _, ok := s.lookup(c); ok {
		return true, nil
	}
	return s.Blockstore.Has(ctx, c)
}

func (s *servedStore) GetSize(ctx context.Context, c cid.Cid) (int, error) {
	if _, b, ok := s.lookup(c); ok {
		return b.len, nil
	}
	return s.Blockstore.GetSize(ctx, c)
}

// Get reads a served block from its source. A source's bytes do not change,
// so the block is what its digest names; whoever receives it checks that
// anyway.
func (s *servedStore) Get(ctx context.Context, c cid.Cid) (blocks.Block, error) {
	var buf []byte
	data, ok, err := s.readServed(c, &buf)
	switch {
	case !ok:
		return s.Blockstore.Get(ctx, c)
	case err != nil:
		return nil, err
	}
	return blocks.NewBlockWithCid(data, c)
}

// readServed reads the served block c into buf (grown as needed) and
// returns it, or reports that c is not a served block: the blob stream's
// server reads each block into one buffer it reuses, where Get allocates a
// block for bitswap to keep.
func (s *servedStore) readServed(c cid.Cid, buf *[]byte) ([]byte, bool, error) {
	src, b, ok := s.lookup(c)
	if !ok {
		return nil, false, nil
	}
	if cap(*buf) < b.len {
		*buf = make([]byte, b.len)
	}
	data := (*buf)[:b.len]
	if _, err := src.ReadAt(data, b.off); err != nil {
		return nil, true, fmt.Errorf("p2p: reading a shared checkpoint block: %w", err)
	}
	return data, true, nil
}

// AllKeysChan lists the blocks below and then the served ones.
func (s *servedStore) AllKeysChan(ctx context.Context) (<-chan cid.Cid, error) {
	below, err := s.Blockstore.AllKeysChan(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	served := make([]cid.Cid, 0, len(s.blocks))
	for c := range s.blocks {
		served = append(served, c)
	}
	s.mu.RUnlock()
	out := make(chan cid.Cid)
	go func() {
		defer close(out)
		for c := range below {
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
		for _, c := range served {
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
