package libp2p

import (
	"context"
	"errors"
	"fmt"
	"time"

	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multihash"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// Blobs are payloads cut into raw CIDv1 BLAKE3 blocks of at most
// BlockSize bytes and moved with bitswap by CID list. Raw blocks and a flat
// list beat a UnixFS DAG here (~4× on loopback, docs/architecture.md §7), and the list
// already travels in the signed announcement.
//
// Every block is reference counted: blobs are held per step and dropped two
// steps later (SetStep), checkpoint blocks are held until the next
// checkpoint replaces them, and a block shared by two owners (identical
// chunks) is deleted only when the last one lets go.

func cidOf(h coordinator.Hash) cid.Cid {
	mh, err := multihash.Encode(h[:], p2p.BlockHashCode)
	if err != nil {
		panic(err) // a 32-byte digest of a registered hash always encodes
	}
	return cid.NewCidV1(cid.Raw, mh)
}

// split cuts data into blocks and returns them with their digests.
func split(data []byte) ([]blocks.Block, []coordinator.Hash) {
	hs := p2p.BlockDigests(data)
	bs := make([]blocks.Block, len(hs))
	for i, h := range hs {
		b, err := blocks.NewBlockWithCid(data[i*p2p.BlockSize:min((i+1)*p2p.BlockSize, len(data))], cidOf(h))
		if err != nil {
			panic(err) // only fails when the digest does not match, and it does
		}
		bs[i] = b
	}
	return bs, hs
}

// store puts blocks and lets bitswap serve them to peers already asking.
// Callers take their references (refStep, setCheckpoint) first, so that a
// collection running meanwhile cannot delete what is being stored.
func (n *Node) store(ctx context.Context, bs []blocks.Block) error {
	if err := n.bstore.PutMany(ctx, bs); err != nil {
		return fmt.Errorf("p2p: store blocks: %w", err)
	}
	return n.bs.NotifyNewBlocks(ctx, bs...)
}

func (n *Node) refStep(step uint32, hs []coordinator.Hash) {
	n.mu.Lock()
	n.stepRefs[step] = append(n.stepRefs[step], hs...)
	for _, h := range hs {
		n.refs[h]++
	}
	n.mu.Unlock()
}

// unref drops one reference per hash and returns those that reached zero.
// Callers hold n.mu and delete the returned blocks after unlocking.
func (n *Node) unref(hs []coordinator.Hash) []coordinator.Hash {
	var drop []coordinator.Hash
	for _, h := range hs {
		n.refs[h]--
		if n.refs[h] <= 0 {
			delete(n.refs, h)
			drop = append(drop, h)
		}
	}
	return drop
}

func (n *Node) deleteBlocks(hs []coordinator.Hash) {
	for _, h := range hs {
		n.mu.Lock()
		live := n.refs[h] > 0 // re-referenced since unref
		n.mu.Unlock()
		if !live {
			_ = n.bstore.DeleteBlock(context.Background(), cidOf(h))
		}
	}
}

func (n *Node) putBlob(ctx context.Context, step uint32, payload []byte) (p2p.BlobRef, error) {
	bs, hs := split(payload)
	if len(hs) > p2p.MaxBlobBlocks {
		return p2p.BlobRef{}, fmt.Errorf("%w: payload of %d bytes", p2p.ErrOversize, len(payload))
	}
	n.refStep(step, hs)
	if err := n.store(ctx, bs); err != nil {
		return p2p.BlobRef{}, err
	}
	return p2p.BlobRef{Size: uint64(len(payload)), Blocks: hs}, nil
}

// getBlocks makes sure every block in hs is in the local store, fetching the
// missing ones over one bitswap session. Bitswap asks every connected peer
// and takes each block from whoever has it; blocks that arrive stay stored,
// so a later attempt resumes instead of starting over.
func (n *Node) getBlocks(ctx context.Context, hs []coordinator.Hash) error {
	var missing []cid.Cid
	seen := map[coordinator.Hash]bool{}
	for _, h := range hs {
		if seen[h] {
			continue
		}
		seen[h] = true
		c := cidOf(h)
		if ok, _ := n.bstore.Has(ctx, c); !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := n.bs.NewSession(ctx).GetBlocks(ctx, missing)
	if err != nil {
		return err
	}
	got := 0
	for b := range ch {
		// Bitswap checks blocks against their CIDs; the client stores them
		// too, but an explicit Put costs little and does not depend on that.
		if err := n.bstore.Put(ctx, b); err != nil {
			return err
		}
		got++
	}
	if got < len(missing) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%d of %d blocks: %w", got, len(missing), err)
		}
		return fmt.Errorf("%w: %d of %d blocks", p2p.ErrFetchFailed, got, len(missing))
	}
	return nil
}

// fill copies the blocks of ref at idx from the local store into out and
// marks them in have. Each is checked again against its digest and its
// length against the announced size, so that nothing beyond the declared
// (and already bounded) size is ever written. A block that is missing is
// an error; one of the wrong length means the announcer's block list does
// not fit its size (ErrCommitmentMismatch).
func (n *Node) fill(ctx context.Context, ref p2p.BlobRef, idx []int, out []byte, have []bool) error {
	for _, i := range idx {
		b, err := n.storedBlock(ctx, ref, i)
		if err != nil {
			return err
		}
		copy(out[i*p2p.BlockSize:], b)
		have[i] = true
	}
	return nil
}

// storedBlock is block i of ref from the local store, checked again
// against its digest and the length ref's size gives it.
func (n *Node) storedBlock(ctx context.Context, ref p2p.BlobRef, i int) ([]byte, error) {
	h := ref.Blocks[i]
	b, err := n.bstore.Get(ctx, cidOf(h))
	if err != nil {
		return nil, err
	}
	if want := p2p.BlockLen(ref.Size, i); len(b.RawData()) != want {
		return nil, fmt.Errorf("%w: block %d has %d bytes, the announced size needs %d", p2p.ErrCommitmentMismatch, i, len(b.RawData()), want)
	}
	if p2p.BlockDigest(b.RawData()) != h {
		return nil, fmt.Errorf("%w: %x", p2p.ErrBlockMismatch, h[:8])
	}
	return b.RawData(), nil
}

// missing lists the indices of the blocks not marked in have.
func missing(have []bool) []int {
	var idx []int
	for i, ok := range have {
		if !ok {
			idx = append(idx, i)
		}
	}
	return idx
}

// Fetch gets the payload of a. Blocks already held are taken from the local
// store; the rest are streamed from the announcer (BlobProtocol), straight
// into the payload, each checked against its digest as it arrives. What the
// stream does not deliver (the announcer is unreachable, slower than
// WithMinFetchRate allows, stops mid-blob or sends a wrong block) is
// streamed from other peers (those that fetched the blob hold it), and what
// they lack is fetched with bitswap, which asks every connected peer. Each attempt is bounded by the fetch timeout
// plus the blob's size at the minimum rate; failures are retried with
// doubling backoff and counted against the announcer. The payload is
// returned only if every block matches the announced list and the list
// matches the announced commitment (checked first). Its blocks are
// stored as slices of it and served to other peers: callers must not modify
// it.
func (n *Node) Fetch(ctx context.Context, a p2p.Announcement) ([]byte, error) {
	if err := n.alive(); err != nil {
		return nil, err
	}
	if err := a.Check(); err != nil {
		return nil, err
	}
	if err := a.CheckSize(n.maxPayload.Load()); err != nil {
		return nil, err
	}
	n.refStep(a.Step, a.Blob.Blocks) // partial fetches are collected with the step
	announcer, err := peerIDOf(a.Trainer.P2P)
	if err != nil {
		return nil, fmt.Errorf("%w: trainer key: %v", p2p.ErrMalformed, err)
	}
	// The commitment covers the block list, so a list that does not match
	// it is refused before anything is fetched or allocated.
	if p2p.CommitmentOf(a.Step, a.Batch, a.Blob) != a.Commitment {
		n.peerError(a.Trainer.P2P, "commitment", p2p.ErrCommitmentMismatch)
		n.m.FetchFailures.Inc()
		return nil, fmt.Errorf("%w: the block list of step %d batch [%d,%d) from %x", p2p.ErrCommitmentMismatch, a.Step, a.Batch.Start, a.Batch.End, a.Trainer.P2P[:8])
	}
	start := time.Now()
	out := make([]byte, a.Blob.Size)
	have := make([]bool, len(a.Blob.Blocks))
	var local []int
	for i, h := range a.Blob.Blocks {
		if ok, _ := n.bstore.Has(ctx, cidOf(h)); ok {
			local = append(local, i)
		}
	}
	if err := n.fill(ctx, a.Blob, local, out, have); err != nil {
		// Collected meanwhile, or the wrong length: the attempts sort it out.
		clear(have)
	}
	// Each peer is streamed from at most once per fetch: the announcer
	// first, then up to 4 others (those that fetched the blob
	// already hold it). A peer that fails its stream is still asked by
	// bitswap, beside everyone else.
	tried := map[peer.ID]bool{n.host.ID(): true}
	if n.cfg.noStream {
		tried[announcer] = true
	}
	stream := func(actx context.Context, p peer.ID) error {
		tried[p] = true
		_, err := n.streamBlocks(actx, p, a.Blob, missing(have), out, have)
		if err != nil && actx.Err() == nil {
			if k, ok := pubkeyOf(p); ok {
				n.peerError(k, "stream", err)
			}
		}
		return actx.Err()
	}
	err = n.retrying(ctx, n.cfg.attemptTimeout(a.Blob.Size), func(actx context.Context) (bool, error) {
		if announcer != n.host.ID() && n.host.Network().Connectedness(announcer) != network.Connected {
			if err := n.host.Connect(actx, peer.AddrInfo{ID: announcer}); err != nil {
				n.peerError(a.Trainer.P2P, "dial announcer", err)
			}
		}
		if len(missing(have)) > 0 && !tried[announcer] {
			if err := stream(actx, announcer); err != nil {
				return false, err
			}
		}
		if !n.cfg.noStream {
			others := 0
			for _, p := range n.host.Network().Peers() {
				if len(missing(have)) == 0 || others == n.cfg.streamPeers {
					break
				}
				if tried[p] {
					continue
				}
				others++
				if err := stream(actx, p); err != nil {
					return false, err
				}
			}
		}
		if idx := missing(have); len(idx) > 0 {
			hs := make([]coordinator.Hash, len(idx))
			for k, i := range idx {
				hs[k] = a.Blob.Blocks[i]
			}
			if err := n.getBlocks(actx, hs); err != nil {
				n.peerError(a.Trainer.P2P, "fetch", err)
				return false, err
			}
			if err := n.fill(ctx, a.Blob, idx, out, have); err != nil {
				n.peerError(a.Trainer.P2P, "commitment", err)
				return errors.Is(err, p2p.ErrCommitmentMismatch), err
			}
		}
		// Every block matched its digest (on arrival, and fill checks the
		// rest), and the digests match the commitment.
		return false, nil
	})
	switch {
	case err == nil:
		n.m.BlobsFetched.Inc()
		n.m.BlobBytes.Add(float64(len(out)))
		n.m.FetchSeconds.Observe(time.Since(start).Seconds())
		return out, nil
	case errors.Is(err, p2p.ErrFetchFailed):
		return nil, fmt.Errorf("%w: step %d batch [%d,%d) from %x", err, a.Step, a.Batch.Start, a.Batch.End, a.Trainer.P2P[:8])
	}
	return nil, err
}

// errAttemptTimedOut ends a fetch attempt that outlived its timeout.
var errAttemptTimedOut = errors.New("p2p: fetch attempt timed out")

// retrying runs attempt until it succeeds, at most 1 + WithFetchRetries
// times, with a doubling backoff between tries and timeout on each.
// An attempt that reports its failure final ends the retries with that
// error; ctx ending ends them with ctx's. Running out of tries is
// ErrFetchFailed wrapping the last error. Failures count in the stats.
// The timeout runs on the node's clock, as the stall timer does, so that a
// test can hold it still while a loaded machine is slow.
func (n *Node) retrying(ctx context.Context, timeout time.Duration, attempt func(ctx context.Context) (final bool, err error)) error {
	backoff := n.cfg.retryBackoff
	var lastErr error
	for try := 0; try <= n.cfg.fetchRetries; try++ {
		if try > 0 {
			n.m.FetchRetries.Inc()
			if err := sleep(ctx, backoff); err != nil {
				return err
			}
			backoff *= 2
		}
		actx, cancel := context.WithCancelCause(ctx)
		stop := n.cfg.clock.AfterFunc(timeout, func() { cancel(errAttemptTimedOut) })
		final, err := attempt(actx)
		stop()
		if err != nil && errors.Is(context.Cause(actx), errAttemptTimedOut) {
			err = fmt.Errorf("%w after %v: %w", errAttemptTimedOut, timeout, err)
		}
		cancel(nil)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if final {
			n.m.FetchFailures.Inc()
			return err
		}
		lastErr = err
	}
	n.m.FetchFailures.Inc()
	return fmt.Errorf("%w: %w", p2p.ErrFetchFailed, lastErr)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
