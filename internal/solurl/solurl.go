// Package solurl owns the one rule that places a Solana validator's
// websocket endpoint beside its JSON-RPC endpoint, for the chain backend and
// the validator tooling alike.
package solurl

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
)

// WebsocketBeside is the websocket endpoint Solana's convention puts beside
// an RPC endpoint (web3.js derives it the same way): ws:// for http:// and
// wss:// for https://, and when the URL names a port, the port + 1, where
// solana-test-validator, Agave and psyche's local validator serve it. A URL
// without a port (an RPC provider behind a proxy) keeps its host and path.
func WebsocketBeside(rpcURL string) (string, error) {
	u, err := url.Parse(rpcURL)
	if err != nil {
		return "", fmt.Errorf("RPC URL %q: %w", rpcURL, err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("RPC URL %q is not http(s)", rpcURL)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n >= 65535 {
			return "", fmt.Errorf("RPC URL %q: port %q has no port after it", rpcURL, p)
		}
		u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(n+1))
	}
	return u.String(), nil
}
