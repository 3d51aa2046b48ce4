package p2p

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/psyche-go/psyche/coordinator"
)

// The checkpoint offer protocol: how a joiner learns which checkpoint to
// fetch. The coordinator only says that the previous epoch's clients hold
// the model; the manifest id that names it is asked of them directly.
//
// Protocol id OfferProtocol. The requester writes one request and closes its
// write side; the responder writes one response and closes. Encoding version
// 1, little-endian:
//
//	request:  the pull request's encoding (pull_protocol.go), with the epoch
//	          whose starting model is wanted in place of the step
//	response: 0 u8 version (1) | 1 u8 count N (0 or 1) | 2 N × 32 manifest id
//
// N is 0 when the peer serves no checkpoint for that epoch.

// OfferProtocol is the libp2p protocol id of checkpoint offers.
const OfferProtocol = "/psyche/checkpoint-offer/1"

const (
	offerVersion     = 1
	maxOfferResponse = 2 + 32
	offerTimeout     = 5 * time.Second
	offerConcurrency = 8
)

// encodeOffer encodes the answer for a checkpoint (ok) or for none.
func encodeOffer(id coordinator.Hash, ok bool) []byte {
	if !ok {
		return []byte{offerVersion, 0}
	}
	return append([]byte{offerVersion, 1}, id[:]...)
}

// DecodeOffer parses a checkpoint offer: the manifest id, or ok false if the
// peer offers none.
func DecodeOffer(b []byte) (id coordinator.Hash, ok bool, err error) {
	r := reader{b: b}
	if v := r.u8(); r.err == nil && v != offerVersion {
		return id, false, fmt.Errorf("%w: offer version %d", ErrVersion, v)
	}
	switch n := r.u8(); {
	case r.err != nil:
	case n > 1:
		return id, false, fmt.Errorf("%w: %d offers", ErrMalformed, n)
	case n == 1:
		copy(id[:], r.bytes(len(id)))
		ok = true
	}
	if err := r.done(); err != nil {
		return coordinator.Hash{}, false, err
	}
	return id, ok, nil
}

// offer records the checkpoint this node serves for joiners of epoch.
func (n *Node) offer(epoch uint32, id coordinator.Hash) {
	n.mu.Lock()
	n.offered = &checkpointOffer{epoch: epoch, id: id}
	n.mu.Unlock()
}

type checkpointOffer struct {
	epoch uint32
	id    coordinator.Hash
}

// serveOffer answers one offer request.
func (n *Node) serveOffer(req PullRequest) []byte {
	n.mu.Lock()
	o := n.offered
	n.mu.Unlock()
	if o == nil || o.epoch != req.Step {
		return encodeOffer(coordinator.Hash{}, false)
	}
	return encodeOffer(o.id, true)
}

// FindCheckpoint asks the given peers which checkpoint they serve for
// joiners of epoch and returns the manifest id that most of them name. Peers
// that offer none, or cannot be reached, do not count; a tie between
// different ids is an error (one of them is wrong, and there is no telling
// which), as is no offer at all.
func (n *Node) FindCheckpoint(ctx context.Context, epoch uint32, from []coordinator.Pubkey) (coordinator.Hash, error) {
	if err := n.alive(); err != nil {
		return coordinator.Hash{}, err
	}
	req, err := PullRequest{RunID: *n.cfg.runID, Step: epoch}.MarshalBinary()
	if err != nil {
		return coordinator.Hash{}, err
	}
	var (
		mu      sync.Mutex
		votes   = map[coordinator.Hash]int{}
		lastErr error
		wg      sync.WaitGroup
		limit   = make(chan struct{}, offerConcurrency)
	)
	for _, k := range from {
		p, err := peerIDOf(k)
		if err != nil || p == n.host.ID() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			limit <- struct{}{}
			defer func() { <-limit }()
			id, ok, err := n.askOffer(ctx, p, req)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				lastErr = err
				n.peerError(k, "checkpoint offer", err)
			case ok:
				votes[id]++
			}
		}()
	}
	wg.Wait()
	if len(votes) == 0 {
		if lastErr != nil {
			return coordinator.Hash{}, fmt.Errorf("%w for epoch %d: %w", ErrNoCheckpoint, epoch, lastErr)
		}
		return coordinator.Hash{}, fmt.Errorf("%w for epoch %d among %d peers", ErrNoCheckpoint, epoch, len(from))
	}
	ids := make([]coordinator.Hash, 0, len(votes))
	for id := range votes {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(a, b int) bool { return votes[ids[a]] > votes[ids[b]] })
	if len(ids) > 1 && votes[ids[0]] == votes[ids[1]] {
		return coordinator.Hash{}, fmt.Errorf("%w: %d peers offer %x, %d offer %x", ErrCheckpointDisputed,
			votes[ids[0]], ids[0][:8], votes[ids[1]], ids[1][:8])
	}
	return ids[0], nil
}

func (n *Node) askOffer(ctx context.Context, p peer.ID, req []byte) (coordinator.Hash, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, offerTimeout)
	defer cancel()
	if n.host.Network().Connectedness(p) != network.Connected {
		if err := n.host.Connect(ctx, peer.AddrInfo{ID: p}); err != nil {
			return coordinator.Hash{}, false, err
		}
	}
	b, err := n.request(ctx, p, OfferProtocol, req, maxOfferResponse)
	if err != nil {
		return coordinator.Hash{}, false, err
	}
	return DecodeOffer(b)
}

// request opens a stream to p, writes req, closes the write side and reads
// the answer (at most limit bytes; a longer one is an error).
func (n *Node) request(ctx context.Context, p peer.ID, proto string, req []byte, limit int64) ([]byte, error) {
	s, err := n.host.NewStream(ctx, p, protocol.ID(proto))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(d)
	}
	if _, err := s.Write(req); err != nil {
		s.Reset()
		return nil, err
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(s, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: answer over %d bytes", ErrOversize, limit)
	}
	return b, nil
}
