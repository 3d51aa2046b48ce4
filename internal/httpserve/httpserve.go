// Package httpserve owns what every HTTP listener of the binary has in
// common against strangers: read, write and idle timeouts, and a cap on the
// connections open at once. Without an idle timeout net/http keeps a
// keep-alive connection forever (its fallback is the read timeout), so
// 5,000 idle connections to `psyche explorer` stayed open for minutes.
package httpserve

import (
	"context"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits are one listener's timeouts and connection cap. Every field must
// be positive; Defaults suits a public listener.
type Limits struct {
	// ReadHeader bounds the reading of a request's headers.
	ReadHeader time.Duration
	// Read bounds the reading of a whole request (headers and body).
	Read time.Duration
	// Write bounds the writing of a response. A long-lived response (an
	// event stream) sets a deadline per write instead, through
	// http.ResponseController.
	Write time.Duration
	// Idle is how long a keep-alive connection may wait for its next
	// request.
	Idle time.Duration
	// MaxConns caps the connections open at once: past it, new ones wait
	// to be accepted until one closes.
	MaxConns int
}

// Defaults are the limits of a public listener: 10 s for headers, 30 s for
// a request and for a response, 2 min idle, 1,024 connections (each costs
// a goroutine and a few KiB of buffers: ~30 MB at the cap).
var Defaults = Limits{ReadHeader: 10 * time.Second, Read: 30 * time.Second, Write: 30 * time.Second,
	Idle: 2 * time.Minute, MaxConns: 1024}

// Server is an http.Server for h with l's timeouts; its requests' contexts
// derive from base.
func (l Limits) Server(h http.Handler, base context.Context) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read, WriteTimeout: l.Write,
		IdleTimeout: l.Idle, BaseContext: func(net.Listener) context.Context { return base }}
}

// Listener caps the connections ln accepts at once at l.MaxConns.
func (l Limits) Listener(ln net.Listener) net.Listener { return netutil.LimitListener(ln, l.MaxConns) }

// Serve serves h on ln with l's limits until ctx ends, then shuts the
// server down (waiting up to grace for requests in flight). It returns nil
// after ctx ends and the server's error if it stops by itself.
func (l Limits) Serve(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration) error {
	hs := l.Server(h, ctx)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l.Listener(ln)) }()
	select {
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		_ = hs.Shutdown(shutdown)
		return nil
	case err := <-errc:
		return err
	}
}
