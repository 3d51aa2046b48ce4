package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
)

// What the run explorer (package explorer) needs from a server: its page
// served beside the API, the runs in process, and the run list over HTTP.

// WithPage serves h at every GET path the API does not claim (the run
// explorer's page at "/"). The page is read-only: it cannot send
// instructions, which need a signed request to POST /v1/instructions.
func WithPage(h http.Handler) Option {
	return func(c *config) error {
		if h == nil {
			return fmt.Errorf("server: nil page handler")
		}
		c.page = h
		return nil
	}
}

// Subscribe delivers a run's snapshots in process (the same ones its
// events stream sends), the current one first, until ctx ends or the run is
// freed; the channel is closed then. A slow reader misses intermediate
// snapshots, never the newest.
func (s *Server) Subscribe(ctx context.Context, runID string) (<-chan chain.Snapshot, error) {
	sub, cancel, f, _ := s.subscribe(runID, inProcess, nil)
	if f != nil {
		if f.Name == "RunNotFound" {
			return nil, fmt.Errorf("%w: %q", chain.ErrRunNotFound, runID)
		}
		return nil, fmt.Errorf("server: %s: %s", f.Name, f.Error)
	}
	ch := sub.ch
	out := make(chan chain.Snapshot)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, open := <-ch:
				if !open {
					return
				}
				state, err := decodeEvent(ev)
				if err != nil {
					s.cfg.log.Error("decoding the server's own account", "run", runID, "err", err)
					return
				}
				select {
				case out <- chain.Snapshot{State: state}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// inProcess is the address of in-process subscribers (the built-in
// explorer): the stream limits do not count them (subscribe).
const inProcess = "in-process"

// decodeEvent reads an event's account.
func decodeEvent(ev *event) (*coordinator.Coordinator, error) {
	return coordinator.DecodeAccount(ev.acct)
}
