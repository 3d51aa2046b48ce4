// Package httpserve owns what every HTTP listener of the binary has in
// common against strangers: read, write and idle timeouts, and caps on the
// connections open at once, per address and in all (internal/connlimit).
// Without an idle timeout net/http keeps a keep-alive connection forever
// (its fallback is the read timeout), so 5,000 idle connections to `psyche
// explorer` stayed open for minutes; with only a total cap, one host's
// keep-alive connections that send a request every 20 s (so never idle long
// enough to time out) held every slot, and a fresh client waited minutes.
package httpserve

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"time"

	"github.com/psyche-go/psyche/internal/connlimit"
)

// Limits are one listener's timeouts and connection caps. Every field must
// be positive (but see Listener); Defaults suits a public listener.
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
	// MaxConns caps the connections open at once. Past it, a new
	// connection takes the place of an idle one (or one that has not sent
	// a whole request yet) of the address group that holds the most, if
	// that group holds at least two more than the newcomer's; otherwise it
	// is closed at once.
	MaxConns int
	// MaxConnsPerAddr caps the connections of one address group (an IPv4
	// address, an IPv6 /64): past it, a new one from the group takes the
	// place of the group's connection idle the longest, or is closed.
	MaxConnsPerAddr int
}

// Defaults are the limits of a public listener: 10 s for headers, 30 s for
// a request and for a response, 2 min idle, 1,024 connections (each costs
// a goroutine and a few KiB of buffers: ~30 MB at the cap), 64 of them from
// one address (a browser opens at most 6 to a host, plus its streams; 16
// addresses fill the listener before anyone is shed).
var Defaults = Limits{ReadHeader: 10 * time.Second, Read: 30 * time.Second, Write: 30 * time.Second,
	Idle: 2 * time.Minute, MaxConns: 1024, MaxConnsPerAddr: 64}

// Server is an http.Server for h with l's timeouts; its requests' contexts
// derive from base. Serve it on l.Listener's listener: the server tells the
// listener which connections are idle (and so may be shed).
func (l Limits) Server(h http.Handler, base context.Context) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read, WriteTimeout: l.Write,
		IdleTimeout: l.Idle, BaseContext: func(net.Listener) context.Context { return base }, ConnState: connState}
}

// connState marks a connection sheddable while it waits for a request
// (new, or idle between requests) and not while one is served (an event
// stream is a request served for as long as it lasts).
func connState(c net.Conn, st http.ConnState) {
	lc, ok := c.(*connlimit.Conn)
	if !ok {
		return
	}
	switch st {
	case http.StateNew, http.StateIdle:
		lc.SetSheddable(true)
	case http.StateActive, http.StateHijacked:
		lc.SetSheddable(false)
	}
}

// Listener caps the connections ln accepts with l's MaxConns and
// MaxConnsPerAddr (a MaxConnsPerAddr of 0: MaxConns/16, at least 1).
func (l Limits) Listener(ln net.Listener) *connlimit.Listener {
	per := l.MaxConnsPerAddr
	if per <= 0 {
		per = max(l.MaxConns/16, 1)
	}
	return connlimit.NewListener(ln, l.MaxConns, per)
}

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

// WriteJSON answers v as JSON with status. API answers describe state that
// changes, so no cache keeps them.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
