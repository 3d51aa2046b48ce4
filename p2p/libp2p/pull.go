package libp2p

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/psyche-go/psyche/p2p"
)

const pullTimeout = 10 * time.Second

// servePull answers one pull request with the announcements held for the
// step. Everything it sends was validated on the way in, and the requester
// validates it again.
func (n *Node) servePull(req p2p.PullRequest) []byte {
	n.mu.Lock()
	var items [][]byte
	size := 3
	for _, it := range n.held[req.Step] {
		// Stay within what a requester reads; the rest can be pulled from
		// another peer or arrives by gossip.
		if len(items) == p2p.MaxPullAnnouncements || size+4+len(it) > p2p.MaxPullResponseSize {
			break
		}
		items = append(items, it)
		size += 4 + len(it)
	}
	n.mu.Unlock()
	resp, err := p2p.EncodePullResponse(items)
	if err != nil {
		return nil
	}
	return resp
}

// serve is the stream handler of a request/response protocol whose requests
// use the pull request's encoding: it reads one request for this run, and
// writes what answer returns (nil: reset the stream).
func (n *Node) serve(timeout time.Duration, answer func(p2p.PullRequest) []byte) network.StreamHandler {
	return func(s network.Stream) {
		defer s.Close()
		_ = s.SetDeadline(time.Now().Add(timeout))
		b, err := io.ReadAll(io.LimitReader(s, p2p.MaxPullRequestSize+1))
		if err != nil {
			s.Reset()
			return
		}
		req, err := p2p.DecodePullRequest(b)
		if err != nil || req.RunID != *n.cfg.runID {
			s.Reset()
			return
		}
		resp := answer(req)
		if resp == nil {
			s.Reset()
			return
		}
		if _, err := s.Write(resp); err != nil {
			s.Reset()
		}
	}
}

// Pull asks every connected peer for its announcements of step and returns
// the valid ones the trainer has not received yet (in no particular order).
// It fails only if no peer answered.
func (n *Node) Pull(ctx context.Context, step uint32) ([]p2p.Announcement, error) {
	if err := n.alive(); err != nil {
		return nil, err
	}
	req, err := p2p.PullRequest{RunID: *n.cfg.runID, Step: step}.MarshalBinary()
	if err != nil {
		return nil, err
	}
	peers := n.host.Network().Peers()
	var (
		mu       sync.Mutex
		out      []p2p.Announcement
		answered int
		lastErr  error
		wg       sync.WaitGroup
		limit    = make(chan struct{}, 8)
	)
	for _, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			limit <- struct{}{}
			defer func() { <-limit }()
			got, err := n.pullFrom(ctx, p, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				lastErr = err
				return
			}
			answered++
			out = append(out, got...)
		}()
	}
	wg.Wait()
	if answered == 0 && len(peers) > 0 {
		return nil, fmt.Errorf("p2p: pull step %d: no peer answered: %w", step, lastErr)
	}
	return out, nil
}

func (n *Node) pullFrom(ctx context.Context, p peer.ID, req []byte) ([]p2p.Announcement, error) {
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	b, err := n.request(ctx, p, p2p.PullProtocol, req, p2p.MaxPullResponseSize)
	if err != nil {
		return nil, err
	}
	remote, _ := pubkeyOf(p)
	items, err := p2p.DecodePullResponse(b)
	if err != nil {
		n.peerError(remote, "pull response", err)
		return nil, err
	}
	var out []p2p.Announcement
	for _, raw := range items {
		a, err := n.check(raw)
		if err != nil {
			// A peer only serves what it validated: a bad item is its fault.
			n.reject(err, p)
			n.peerError(remote, "pull item", err)
			continue
		}
		if n.markSeen(&a) {
			n.m.Accepted.Inc()
		}
		if n.hold(&a, raw) {
			out = append(out, a)
		}
	}
	return out, nil
}
