package server

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/psyche-go/psyche/chain/serverwire"
	"github.com/psyche-go/psyche/internal/connlimit"
	"github.com/psyche-go/psyche/internal/httpserve"
)

// subscriber is one event stream: ch holds the newest event it has not
// written yet.
type subscriber struct {
	ch   chan *event
	addr string
}

// subscribe registers a stream from addr (a remote address, or inProcess)
// that receives the run's account on every change, starting with the
// current one, within the subscriber limits. shed, if not nil, is called
// when the stream is closed to make room for a lighter address group's
// (WithSubscriberLimits): the caller must then end it.
func (s *Server) subscribe(id, addr string, shed func()) (*subscriber, func(), *serverwire.Failure, int) {
	r, f, st := s.liveRun(id)
	if f != nil {
		return nil, nil, f, st
	}
	// The caps are for strangers' streams. The server's own page (the
	// built-in explorer) follows every run in process, one stream a run: it
	// is bounded by the runs, and counting it would let anonymous streams
	// (or a hundred runs under one "address") blind the page.
	var slot *connlimit.Slot
	if addr != inProcess {
		group := connlimit.GroupOf(addr)
		if slot = s.subs.Acquire(group, true, func() {
			s.cfg.metrics.ShedSubscribers.Inc()
			s.cfg.log.Debug("closing an event stream for a lighter address's", "run", id, "addr", addr)
			if shed != nil {
				shed()
			}
		}); slot == nil {
			total, held := s.subs.Len(group)
			detail := fmt.Sprintf("%s holds %d streams", group, held)
			if held < s.cfg.maxSubsPerAddr {
				detail = fmt.Sprintf("the server holds %d streams", total)
			}
			f, st := serverwire.Refuse("TooManySubscribers", detail)
			return nil, nil, f, st
		}
	}
	sub := &subscriber{ch: make(chan *event, 1), addr: addr}
	r.mu.Lock()
	if r.gone {
		close(sub.ch)
	} else {
		r.subs[sub] = struct{}{}
		sub.ch <- newEvent(r.state.MarshalAccount())
	}
	r.mu.Unlock()
	s.cfg.metrics.Subscribers.Inc()
	var once sync.Once
	return sub, func() {
		once.Do(func() {
			s.cfg.metrics.Subscribers.Dec()
			r.mu.Lock()
			delete(r.subs, sub)
			r.mu.Unlock()
			if slot != nil {
				slot.Release()
			}
		})
	}, nil, 0
}

// streamRetryAfter is what a refused stream's Retry-After says (seconds):
// the client polls meanwhile (serverclient.Client).
const streamRetryAfter = 10

const maxBody = 1 << 16

// Handler serves the HTTP API:
//
//	POST /v1/instructions          a signed request (see wire.go) → Result or Failure (JSON)
//	GET  /v1/runs                  run ids (JSON)
//	GET  /v1/runs/{id}             the account bytes (with an ETag: If-None-Match is answered 304 while it has not changed)
//	GET  /v1/runs/{id}/binding     what requests for the run are signed for (JSON BindingInfo)
//	GET  /v1/runs/{id}/events      server-sent events, one base64 account per change (?deltas=1: then what changed; events.go); 429 with Retry-After past the stream caps
//	GET  /v1/p2p                   the p2p host's addresses and whether it relays (JSON P2PInfo; 404 without one)
//	GET  /healthz                  "ok"
//	GET  /data/{path...}           a file of the data directory, WithData (data.go): ranges, HEAD; 429 with Retry-After past the read caps
//	GET  /                         the run explorer's page, WithPage (read-only)
//
// Every refusal is a JSON Failure with an HTTP status (serverwire/errors.go).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/instructions", func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBody))
		if err != nil {
			httpserve.WriteJSON(w, http.StatusRequestEntityTooLarge, &serverwire.Failure{Name: "BadRequest", Error: err.Error()})
			return
		}
		res, fail, status := s.Execute(body)
		if fail != nil {
			httpserve.WriteJSON(w, status, fail)
			return
		}
		httpserve.WriteJSON(w, status, res)
	})
	mux.HandleFunc("GET /v1/runs", func(w http.ResponseWriter, _ *http.Request) { httpserve.WriteJSON(w, http.StatusOK, s.Runs()) })
	mux.HandleFunc("GET /v1/runs/{id}", func(w http.ResponseWriter, req *http.Request) {
		id := req.PathValue("id")
		if _, f, st := s.liveRun(id); f != nil {
			httpserve.WriteJSON(w, st, f)
			return
		}
		acct, ok := s.Account(id)
		if !ok {
			httpserve.WriteJSON(w, http.StatusNotFound, &serverwire.Failure{Name: "RunNotFound", Error: "server: no such run"})
			return
		}
		// A client polling the run (its stream refused: serverclient.Client) asks
		// whether it changed, and is told so in a few bytes.
		tag := fmt.Sprintf(`"%016x"`, maphash.Bytes(s.etagSeed, acct))
		w.Header().Set("ETag", tag)
		w.Header().Set("Cache-Control", "no-cache")
		if req.Header.Get("If-None-Match") == tag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(acct)
	})
	mux.HandleFunc("GET /v1/runs/{id}/binding", func(w http.ResponseWriter, req *http.Request) {
		b, f, st := s.Binding(req.PathValue("id"))
		if f != nil {
			httpserve.WriteJSON(w, st, f)
			return
		}
		httpserve.WriteJSON(w, http.StatusOK, serverwire.BindingInfo{Server: hex.EncodeToString(b.Server[:]), Incarnation: b.Incarnation, Floor: b.Floor, Now: b.Now})
	})
	mux.HandleFunc("GET /v1/runs/{id}/events", s.serveEvents)
	mux.HandleFunc("GET /v1/p2p", func(w http.ResponseWriter, _ *http.Request) {
		if s.cfg.p2p == nil {
			httpserve.WriteJSON(w, http.StatusNotFound, &serverwire.Failure{Name: "NoP2P", Error: "server: this server runs no p2p host"})
			return
		}
		httpserve.WriteJSON(w, http.StatusOK, serverwire.P2PInfo{Addrs: s.cfg.p2p.Addrs(), Relay: s.cfg.p2p.Relay()})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	for _, add := range s.cfg.routes {
		add(mux)
	}
	if s.cfg.page != nil {
		mux.Handle("GET /", s.cfg.page)
	}
	if s.cfg.data != nil {
		// Before the mux, which would clean "/data/../x" into a redirect.
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if isDataPath(req) {
				s.serveData(w, req)
				return
			}
			mux.ServeHTTP(w, req)
		})
	}
	return mux
}

// serveEvents streams a run's snapshots until the client goes away, the run
// is freed, or one event takes longer than the slow-subscriber timeout to
// write (the client stopped reading): then the stream is dropped, so a
// client that never reads holds neither memory nor a goroutine for long.
func (s *Server) serveEvents(w http.ResponseWriter, req *http.Request) {
	addr := req.RemoteAddr
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	// A stream shed for a lighter address group's ends as if its client
	// had gone.
	ctx, end := context.WithCancel(req.Context())
	defer end()
	sub, cancel, f, st := s.subscribe(req.PathValue("id"), addr, end)
	if f != nil {
		if st == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", strconv.Itoa(streamRetryAfter))
		}
		httpserve.WriteJSON(w, st, f)
		return
	}
	defer cancel()
	// (The server's read timeout does not matter to a stream: net/http
	// clears it before the read that notices the client going away.)
	events := httpserve.StartEvents(w, s.cfg.slowWrite)
	// A subscriber that takes deltas gets, after the first account, what
	// changed since the one this stream sent last (serverwire/delta.go).
	deltas := req.URL.Query().Get("deltas") == "1"
	var sent []byte
	for {
		select {
		case <-ctx.Done():
			return
		case ev, open := <-sub.ch:
			if !open {
				return
			}
			out := ev.full
			if deltas && sent != nil {
				if d := serverwire.DeltaEvent(sent, ev.acct); d != nil {
					out = d
				}
			}
			sent = ev.acct
			s.cfg.metrics.EventBytes.Add(float64(len(out)))
			if err := events.Send(out); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					s.cfg.metrics.SlowSubscribers.Inc()
					s.cfg.log.Debug("dropping a slow event stream", "run", req.PathValue("id"), "addr", sub.addr)
				}
				return
			}
		}
	}
}

// Serve runs the HTTP API on l and ticks every run on the configured
// interval until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	lim := httpserve.Limits{ReadHeader: min(10*time.Second, s.cfg.readTimeout), Read: s.cfg.readTimeout,
		Write: s.cfg.writeTimeout, Idle: s.cfg.idleTimeout, MaxConns: s.cfg.maxConns, MaxConnsPerAddr: s.cfg.maxConnsPerAddr}
	hs := lim.Server(s.Handler(), ctx)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(lim.Listener(l)) }()
	t := time.NewTimer(s.untilDue())
	defer t.Stop()
	// DEBUG: psyche server prints where it listens on its own.
	s.cfg.log.Debug("server listening", "addr", l.Addr().String(), "dir", s.dir, "server", hex.EncodeToString(s.id[:]))
	for {
		select {
		case <-ctx.Done():
			shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(shutdown)
			return nil
		case err := <-errc:
			return fmt.Errorf("server: %w", err)
		case <-t.C:
			s.Tick()
		case <-s.changed:
		}
		t.Reset(s.untilDue())
	}
}
