package libp2p

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

const (
	offerTimeout     = 5 * time.Second
	offerConcurrency = 8
)

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
func (n *Node) serveOffer(req p2p.PullRequest) []byte {
	n.mu.Lock()
	o := n.offered
	n.mu.Unlock()
	if o == nil || o.epoch != req.Step {
		return p2p.EncodeOffer(coordinator.Hash{}, false)
	}
	return p2p.EncodeOffer(o.id, true)
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
	req, err := p2p.PullRequest{RunID: *n.cfg.runID, Step: epoch}.MarshalBinary()
	if err != nil {
		return coordinator.Hash{}, err
	}
	var (
		mu       sync.Mutex
		votes    = map[coordinator.Hash]int{}
		lastErr  error
		answered int
		wg       sync.WaitGroup
		limit    = make(chan struct{}, offerConcurrency)
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
				answered++
				votes[id]++
			default:
				answered++
			}
		}()
	}
	wg.Wait()
	id, err := p2p.MajorityOffer(votes, answered)
	switch {
	case errors.Is(err, p2p.ErrNoCheckpoint) && lastErr != nil:
		return id, fmt.Errorf("%w for epoch %d: %w", p2p.ErrNoCheckpoint, epoch, lastErr)
	case errors.Is(err, p2p.ErrNoCheckpoint):
		return id, fmt.Errorf("%w for epoch %d among %d peers: %w", p2p.ErrNoCheckpoint, epoch, len(from), p2p.ErrNoHolder)
	}
	return id, err
}

func (n *Node) askOffer(ctx context.Context, p peer.ID, req []byte) (coordinator.Hash, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, offerTimeout)
	defer cancel()
	if n.host.Network().Connectedness(p) != network.Connected {
		if err := n.host.Connect(ctx, peer.AddrInfo{ID: p}); err != nil {
			return coordinator.Hash{}, false, err
		}
	}
	b, err := n.request(ctx, p, p2p.OfferProtocol, req, p2p.MaxOfferResponse)
	if err != nil {
		return coordinator.Hash{}, false, err
	}
	return p2p.DecodeOffer(b)
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
		return nil, fmt.Errorf("%w: answer over %d bytes", p2p.ErrOversize, limit)
	}
	return b, nil
}
