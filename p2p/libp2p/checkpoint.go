package libp2p

import (
	"context"
	"errors"
	"fmt"
	"sync"

	blocks "github.com/ipfs/go-block-format"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// ShareCheckpoint stores tensors as blocks, stores their manifest as one more
// block, and serves both until the next ShareCheckpoint or FetchCheckpoint.
// It returns the manifest id, which is what a joiner needs, and offers it to
// joiners of epoch (FindCheckpoint).
func (n *Node) ShareCheckpoint(ctx context.Context, epoch uint32, tensors []p2p.Tensor) (coordinator.Hash, error) {
	if err := n.alive(); err != nil {
		return coordinator.Hash{}, err
	}
	var m p2p.CheckpointManifest
	var all []blocks.Block
	var hs []coordinator.Hash
	for _, t := range tensors {
		bs, th := split(t.Data)
		all = append(all, bs...)
		hs = append(hs, th...)
		m.Tensors = append(m.Tensors, p2p.TensorEntry{Name: t.Name, DType: t.DType, Shape: t.Shape,
			Blob: p2p.BlobRef{Size: uint64(len(t.Data)), Blocks: th}})
	}
	raw, err := m.MarshalBinary()
	if err != nil {
		return coordinator.Hash{}, err
	}
	mb, mh := split(raw)
	all = append(all, mb...)
	hs = append(hs, mh...)
	n.setCheckpoint(hs)
	if err := n.store(ctx, all); err != nil {
		return coordinator.Hash{}, err
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

// FetchCheckpoint assembles the checkpoint whose manifest id is id. It dials
// the given peers (any connected peer that has blocks serves too), fetches
// the manifest, then every block with at most WithCheckpointConcurrency
// requests in flight over one bitswap session, which spreads the wants over
// the peers that have the blocks. Every block is checked against its digest.
// A request that fails (a peer left mid-transfer, a timeout) is retried with
// backoff; blocks already received are kept, so nothing is fetched twice.
// Afterwards the node shares the checkpoint itself.
func (n *Node) FetchCheckpoint(ctx context.Context, id coordinator.Hash, from []coordinator.Pubkey, want []p2p.TensorSpec) ([]p2p.Tensor, error) {
	if err := n.alive(); err != nil {
		return nil, err
	}
	n.dialAll(ctx, from, "dial checkpoint peer")
	get := n.verifiedBlocks(ctx)
	raw, err := get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("p2p: checkpoint manifest: %w", err)
	}
	m, err := p2p.DecodeCheckpointManifest(raw)
	if err != nil {
		return nil, err
	}
	if err := m.Match(want); err != nil {
		return nil, err
	}
	blocks := distinctBlocks(&m)
	// Hold the blocks from the start, so that a GC running meanwhile cannot
	// take what this fetch has already received.
	n.setCheckpoint(append([]coordinator.Hash{id}, blocks...))
	if err := n.fetchAll(ctx, blocks, get); err != nil {
		return nil, err
	}
	return n.assembleTensors(ctx, &m)
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
// in flight, reporting progress after each; the first failure stops the rest.
func (n *Node) fetchAll(ctx context.Context, blocks []coordinator.Hash, get blockGetter) error {
	work := make(chan coordinator.Hash)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		done     int
		firstErr error
	)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(n.cfg.ckptConcurrency, max(len(blocks), 1)) {
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
				n.m.CheckpointBlocks.Inc()
				mu.Lock()
				done++
				d := done
				mu.Unlock()
				if n.cfg.ckptProgress != nil {
					n.cfg.ckptProgress(d, len(blocks))
				}
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

// assembleTensors puts the manifest's tensors together from the stored
// blocks.
func (n *Node) assembleTensors(ctx context.Context, m *p2p.CheckpointManifest) ([]p2p.Tensor, error) {
	out := make([]p2p.Tensor, 0, len(m.Tensors))
	for _, t := range m.Tensors {
		data, err := n.assemble(ctx, t.Blob)
		if err != nil {
			return nil, fmt.Errorf("p2p: tensor %q: %w", t.Name, err)
		}
		out = append(out, p2p.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: data})
	}
	return out, nil
}
