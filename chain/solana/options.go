package solana

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"time"

	sol "github.com/gagliardetto/solana-go"

	"github.com/psyche-go/psyche/coordinator"
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

// WebsocketFor is the websocket endpoint Solana's convention puts beside an
// RPC endpoint (web3.js derives it the same way): ws:// for http:// and
// wss:// for https://, and when the URL names a port, the port + 1, where
// solana-test-validator, Agave and psyche's local validator serve it. A URL
// without a port (an RPC provider behind a proxy) keeps its host and path.
func WebsocketFor(rpcURL string) (string, error) {
	u, err := url.Parse(rpcURL)
	if err != nil {
		return "", fmt.Errorf("solana: RPC URL %q: %w", rpcURL, err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("solana: RPC URL %q is not http(s)", rpcURL)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n >= 65535 {
			return "", fmt.Errorf("solana: RPC URL %q: bad port", rpcURL)
		}
		u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(n+1))
	}
	return u.String(), nil
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
