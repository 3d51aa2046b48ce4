package chain

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// Backend is where a run's coordinator lives: the embedded server or a
// Solana program account. Both execute the same instructions with the same
// rules; the trainer and the CLI only see this interface.
type Backend interface {
	// Send executes one instruction signed by signer (and, for join_run on a
	// run with a join authority, co-signed by coSigner, which may be nil). A
	// rejected instruction returns the coordinator error (errors.Is works
	// with the coordinator's sentinel errors).
	Send(ctx context.Context, runID string, signer, coSigner Signer, ix coordinator.Instruction) (Receipt, error)
	// Snapshot fetches the current state of a run.
	Snapshot(ctx context.Context, runID string) (Snapshot, error)
	// Subscribe delivers snapshots of a run, each with a newer nonce than the
	// one before, until ctx ends; the channel is closed then. The current
	// state is delivered first.
	Subscribe(ctx context.Context, runID string) (<-chan Snapshot, error)
}

// Bootstrapper is a Backend that also tells trainers where to start on the
// p2p network (the server backend runs a libp2p host for that).
type Bootstrapper interface {
	P2PBootstrap(ctx context.Context) (P2PBootstrap, error)
}

// P2PBootstrap is where a trainer starts on the p2p network: hosts that
// bootstrap the run's DHT, and those of them that relay.
type P2PBootstrap struct {
	Addrs  []string // multiaddrs ending in /p2p/<id>
	Relays []string
}

// ErrNoP2P reports a backend that runs no p2p host.
var ErrNoP2P = errors.New("chain: the backend runs no p2p host")

// Receipt says what an executed instruction did.
type Receipt struct {
	Changed bool
	From    coordinator.RunState
	To      coordinator.RunState
	Nonce   uint64 // the state's nonce after the instruction
}

// Snapshot is a decoded coordinator state.
type Snapshot struct {
	State *coordinator.Coordinator
}

// Nonce is the snapshot's nonce (0 for an empty snapshot).
func (s Snapshot) Nonce() uint64 {
	if s.State == nil {
		return 0
	}
	return s.State.Nonce
}

// ErrRunNotFound reports a run id that no coordinator exists for.
var ErrRunNotFound = errors.New("chain: run not found")

// Newer forwards snapshots from in to the returned channel, dropping any whose
// nonce is not newer than the last one forwarded (snapshots can arrive out of
// order or twice after a reconnect).
func Newer(ctx context.Context, in <-chan Snapshot) <-chan Snapshot {
	out := make(chan Snapshot, 1)
	go func() {
		defer close(out)
		var last uint64
		for {
			select {
			case <-ctx.Done():
				return
			case s, ok := <-in:
				if !ok {
					return
				}
				if s.Nonce() <= last {
					continue
				}
				last = s.Nonce()
				select {
				case out <- s:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// Resubscribe keeps a snapshot stream alive: it runs stream (attempt counts
// from 0) until ctx ends or the stream reports ErrRunNotFound, starts it
// again with backoff after any other failure, and delivers what it sends in
// nonce order (a new stream starts with the current state, which Newer drops
// if nothing changed).
func Resubscribe(ctx context.Context, log *slog.Logger, runID string, stream func(ctx context.Context, attempt int, out chan<- Snapshot) error) <-chan Snapshot {
	raw := make(chan Snapshot, 4)
	go func() {
		defer close(raw)
		backoff := 50 * time.Millisecond
		for attempt := 0; ctx.Err() == nil; attempt++ {
			err := stream(ctx, attempt, raw)
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrRunNotFound) {
				log.Info("run is gone; subscription ends", "run", runID)
				return
			}
			log.Warn("snapshot stream broke; reconnecting", "run", runID, "err", err, "backoff", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}()
	return Newer(ctx, raw)
}
