package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/floodtest"
	"github.com/psyche-go/psyche/internal/promread"
)

// floodGuard only stops a hung test: every wait below ends on an event (a
// fresh client served, a stream's first event, a connection closed).
const floodGuard = 30 * time.Second

// serveLocal serves s on a loopback port until the test ends.
func serveLocal(t *testing.T, s *Server) string {
	t.Helper()
	l, err := listenLocal()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return l.Addr().String()
}

// TestServerServesAFreshClientUnderAKeepAliveFlood: one host's idle
// keep-alive connections (each sends a request now and then, so none idles
// out) hold every connection the server takes; a fresh client, from
// another address or the same one, is served all the same: its connection
// takes the place of an idle one of the host that holds the most. Before,
// the server had only a total cap, and a fresh client waited until a flood
// connection closed (> 72 s at 4,096 connections).
func TestServerServesAFreshClientUnderAKeepAliveFlood(t *testing.T) {
	s, err := New(t.TempDir(), WithMaxConns(64), WithManualTicks())
	if err != nil {
		t.Fatal(err)
	}
	addr := serveLocal(t, s)
	ctx := context.Background()
	flood, err := floodtest.KeepAlive(ctx, addr, []string{"127.0.0.1"}, 64, "/healthz", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Stop()
	for served, _, _, _ := flood.Counts(); served < 64; served, _, _, _ = flood.Counts() {
		time.Sleep(5 * time.Millisecond) // every flood connection served once, and now idle
	}
	for _, from := range []string{"127.0.0.2", "127.0.0.1", "127.0.0.3"} {
		_, status, err := floodtest.Get(ctx, addr, from, "/healthz", floodGuard)
		if err != nil || status != http.StatusOK {
			t.Fatalf("a fresh client from %s while 64 idle connections hold the server: %d %v", from, status, err)
		}
	}
}

// TestConnectionCapPerAddress: one address group holds at most its cap of
// connections; past it, its connection idle the longest is closed for the
// new one. An IPv6 /64 is one group (internal/connlimit's tests; here over
// IPv4 loopback addresses, each its own group).
func TestConnectionCapPerAddress(t *testing.T) {
	s, err := New(t.TempDir(), WithMaxConns(64), WithMaxConnsPerAddr(8), WithManualTicks())
	if err != nil {
		t.Fatal(err)
	}
	addr := serveLocal(t, s)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 20 {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 7)}}).Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(floodGuard))
		conns = append(conns, c)
		if _, err := fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns), err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// 12 of them were closed by the server (the oldest idle ones as the 9th
	// and later came: which ones depends on when the server marked each
	// idle); a read on them ends (EOF, or a reset) instead of waiting.
	closed := make(chan int, len(conns))
	for i, c := range conns {
		go func() {
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				closed <- i
			}
		}()
	}
	guard := time.After(floodGuard)
	for n := 0; n < 12; n++ {
		select {
		case <-closed:
		case <-guard:
			t.Fatalf("%d connections of one address closed; 20 were opened against a cap of 8", n)
		}
	}
}

// streamPath is a run's event stream.
func streamPath(id string) string { return "/v1/runs/" + id + "/events" }

func initRun(t *testing.T, url, id string) {
	t.Helper()
	admin := backendtest.Key("admin")
	rid, _ := coordinator.ParseRunID(id)
	if _, err := serverclient.New(url, nil).Send(context.Background(), id, admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}); err != nil {
		t.Fatal(err)
	}
}

// TestStreamFloodLeavesRoomForAFreshAddress: 8 addresses hold every event
// stream the server takes (8 each, their cap); a fresh address's stream is
// served all the same, in the place of the oldest stream of an address
// that holds the most, and the address that lost it cannot take it back (a
// group is shed only for one that holds at least two fewer). Before, a
// fresh address got 429 for as long as the flood held (> 150 s).
func TestStreamFloodLeavesRoomForAFreshAddress(t *testing.T) {
	m := NewMetrics(nil)
	s, err := New(t.TempDir(), WithSubscriberLimits(64, 8), WithMetrics(m), WithManualTicks())
	if err != nil {
		t.Fatal(err)
	}
	addr := serveLocal(t, s)
	initRun(t, "http://"+addr, "flood")
	ctx := context.Background()
	flood, err := floodtest.Streams(ctx, addr, floodtest.Loopback(1, 8), 8, streamPath("flood"), 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Stop()
	waitGauge(t, "subscribers", func() float64 { return promread.Value(m.Subscribers) }, 64)
	for _, from := range []net.Addr{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 100)}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 101)}} {
		resp, err := openStream(t, "http://"+addr, "flood", from)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("a fresh address's stream while 8 addresses hold all 64: %v %v", resp, err)
		}
		defer resp.Body.Close()
		if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data:") {
			t.Fatalf("a fresh address's stream: %q %v, want its first event", line, err)
		}
	}
	if shed := promread.Value(m.ShedSubscribers); shed != 2 {
		t.Fatalf("%v streams shed, want 2", shed)
	}
	// The two addresses that lost a stream try again every 20 ms and are
	// refused: wait for a few refusals, and check that they shed nothing.
	guard := time.Now().Add(floodGuard)
	for _, _, _, refused := flood.Counts(); refused < 20; _, _, _, refused = flood.Counts() {
		if time.Now().After(guard) {
			t.Fatalf("%d refusals of the flood's new streams in %v", refused, floodGuard)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if shed := promread.Value(m.ShedSubscribers); shed != 2 {
		t.Fatalf("%v streams shed once the flood tried again, want still 2", shed)
	}
}

// streamWriter is a ResponseWriter for a handler called directly: it
// reports the status, discards the events and flushes nothing.
type streamWriter struct {
	h      http.Header
	status chan int
	once   sync.Once
}

func (w *streamWriter) Header() http.Header { return w.h }
func (w *streamWriter) WriteHeader(code int) {
	w.once.Do(func() { w.status <- code })
}
func (w *streamWriter) Write(b []byte) (int, error) { w.WriteHeader(http.StatusOK); return len(b), nil }
func (w *streamWriter) Flush()                      {}

// TestStreamCapGroupsIPv6By64: the per-address stream cap counts an IPv6
// /64 as one address (before, 16 addresses of one /64 held 16 times the
// cap). The handler is called with the remote addresses a listener would
// give it: the loopback interface has one IPv6 address.
func TestStreamCapGroupsIPv6By64(t *testing.T) {
	s, hs := serveHTTP(t, WithSubscriberLimits(1024, 4), WithManualTicks())
	initRun(t, hs.URL, "six")
	h := s.Handler()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	open := func(remote string) int {
		t.Helper()
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, streamPath("six"), nil)
		req.RemoteAddr = remote
		w := &streamWriter{h: http.Header{}, status: make(chan int, 1)}
		wg.Add(1)
		go func() { defer wg.Done(); h.ServeHTTP(w, req) }()
		select {
		case st := <-w.status:
			return st
		case <-time.After(floodGuard):
			t.Fatalf("no answer to a stream from %s", remote)
			return 0
		}
	}
	for i := range 4 {
		if st := open(fmt.Sprintf("[2001:db8::%x]:4000", i+1)); st != http.StatusOK {
			t.Fatalf("stream %d of a /64: HTTP %d", i+1, st)
		}
	}
	for _, tt := range []struct {
		remote string
		want   int
	}{
		{"[2001:db8::ffff:1234:5678:9abc]:1", http.StatusTooManyRequests}, // a 5th address of the /64
		{"[2001:db8::1]:4001", http.StatusTooManyRequests},
		{"[2001:db8:0:1::1]:1", http.StatusOK}, // the next /64
		{"[::ffff:127.0.0.1]:1", http.StatusOK},
		{"127.0.0.1:2", http.StatusOK},
	} {
		if st := open(tt.remote); st != tt.want {
			t.Fatalf("a stream from %s: HTTP %d, want %d", tt.remote, st, tt.want)
		}
	}
}

// countingHandler counts the polls of a run's account and the streams
// served (200), and can refuse polls.
type countingHandler struct {
	h              http.Handler
	polls, streams atomic.Int64
}

type statusWriter struct {
	http.ResponseWriter
	onStatus func(int)
}

func (w *statusWriter) WriteHeader(code int) { w.onStatus(code); w.ResponseWriter.WriteHeader(code) }
func (w *statusWriter) Flush()               { w.ResponseWriter.(http.Flusher).Flush() }
func (w *statusWriter) Unwrap() http.ResponseWriter {
	return w.ResponseWriter
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/events") {
		w = &statusWriter{ResponseWriter: w, onStatus: func(code int) {
			if code == http.StatusOK {
				c.streams.Add(1)
			}
		}}
	} else if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/runs/") && strings.Count(r.URL.Path, "/") == 3 {
		c.polls.Add(1)
	}
	c.h.ServeHTTP(w, r)
}

// TestClientPollsWhileItsStreamIsRefused: a client whose event stream the
// server refuses (its address holds its share) follows the run by polling
// its account, and goes back to a stream once one is free; while streaming
// it polls no more. Before, it tried the stream again and again and
// delivered nothing while refused.
func TestClientPollsWhileItsStreamIsRefused(t *testing.T) {
	m := NewMetrics(nil)
	s, err := New(t.TempDir(), WithSubscriberLimits(1, 1), WithMetrics(m), WithManualTicks())
	if err != nil {
		t.Fatal(err)
	}
	ch := &countingHandler{h: s.Handler()}
	hs := httptest.NewServer(ch)
	defer hs.Close()
	initRun(t, hs.URL, "poll")
	// Another stream from this address holds the only place.
	blocker, err := openStream(t, hs.URL, "poll", nil)
	if err != nil || blocker.StatusCode != http.StatusOK {
		t.Fatalf("the first stream: %v %v", blocker, err)
	}
	defer blocker.Body.Close()
	if resp, err := openStream(t, hs.URL, "poll", nil); err != nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a second stream: %v %v, want 429 with Retry-After", resp, err)
	} else {
		resp.Body.Close()
	}

	c := serverclient.New(hs.URL, nil, serverclient.WithPolling(10*time.Millisecond, 50*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snaps, err := c.Subscribe(ctx, "poll")
	if err != nil {
		t.Fatal(err)
	}
	admin := backendtest.Key("admin")
	name := func(st *coordinator.Coordinator) string {
		return strings.TrimRight(string(st.Metadata.Name[:]), "\x00")
	}
	// waitName receives snapshots until the run's name is want.
	waitName := func(want string) {
		t.Helper()
		guard := time.After(floodGuard)
		for {
			select {
			case snap, ok := <-snaps:
				if !ok {
					t.Fatal("the subscription ended")
				}
				if name(snap.State) == want {
					return
				}
			case <-guard:
				t.Fatalf("no snapshot named %q", want)
			}
		}
	}
	rename := func(to string) {
		t.Helper()
		var md coordinator.Metadata
		copy(md.Name[:], to)
		if _, err := c.Send(ctx, "poll", admin, nil, &coordinator.Update{Metadata: &md}); err != nil {
			t.Fatal(err)
		}
	}
	rename("polled")
	waitName("polled")
	if ch.polls.Load() == 0 || ch.streams.Load() != 1 {
		t.Fatalf("%d polls, %d streams served: the change came otherwise than by polling", ch.polls.Load(), ch.streams.Load())
	}
	// The place frees: the client takes a stream at its next try.
	blocker.Body.Close()
	for ch.streams.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	polls := ch.polls.Load()
	rename("streamed")
	waitName("streamed")
	if got := ch.polls.Load(); got != polls {
		t.Fatalf("%d polls after the stream was served, want none", got-polls)
	}
	var _ chain.Backend = c
}
