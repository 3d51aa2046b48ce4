package solana

import (
	"fmt"
	"log/slog"
	"time"

	sol "github.com/gagliardetto/solana-go"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/solurl"
)

type config struct {
	rpcs    []string
	wss     []string
	program sol.PublicKey
	log     *slog.Logger
	retries int
	confirm time.Duration
}

// Option configures a Backend.
type Option func(*config) error

// WithRPC sets the JSON-RPC endpoints, tried in order.
func WithRPC(urls ...string) Option {
	return func(c *config) error { c.rpcs = append(c.rpcs, urls...); return nil }
}

// WebsocketFor is the websocket endpoint beside an RPC endpoint
// (internal/solurl: ws(s) for http(s), the port + 1 when it names one).
func WebsocketFor(rpcURL string) (string, error) {
	ws, err := solurl.WebsocketBeside(rpcURL)
	if err != nil {
		return "", fmt.Errorf("solana: %w", err)
	}
	return ws, nil
}

// WithWebsocket sets the websocket endpoints, tried in order.
func WithWebsocket(urls ...string) Option {
	return func(c *config) error { c.wss = append(c.wss, urls...); return nil }
}

// WithProgramID sets the coordinator program's address (default LocalProgramID).
func WithProgramID(id coordinator.Pubkey) Option {
	return func(c *config) error { c.program = sol.PublicKeyFromBytes(id[:]); return nil }
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { c.log = l; return nil }
}

// WithConfirmTimeout bounds the wait for a transaction to be confirmed.
func WithConfirmTimeout(d time.Duration) Option {
	return func(c *config) error { c.confirm = d; return nil }
}
