package httpserve

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
	"testing"
	"time"

	"github.com/psyche-go/psyche/internal/connlimit"
)

// hangGuard only stops a hung test: every wait below ends on an event.
const hangGuard = 30 * time.Second

func serve(t *testing.T, l Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- l.Serve(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), time.Second)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	return c
}

const request = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"

// waitClosed reads until the server closes c: an error that is not the
// hang guard's deadline.
func waitClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: still open after %v", what, hangGuard)
	}
}

// A stranger's connection that sends no request, or that stays open after
// one, is closed by the server (before: a keep-alive connection stayed open
// for good, since net/http's idle timeout falls back to the read timeout).
func TestIdleConnectionsAreClosed(t *testing.T) {
	l := Defaults
	l.ReadHeader, l.Idle = 50*time.Millisecond, 50*time.Millisecond
	addr := serve(t, l)

	silent := dial(t, addr)
	waitClosed(t, silent, "a connection that sent nothing")

	idle := dial(t, addr)
	if _, err := io.WriteString(idle, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "ok" {
		t.Fatalf("body %q", body)
	}
	waitClosed(t, idle, "a keep-alive connection after its request")
}

// dialFrom dials addr from a loopback source address (127.0.0.x).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	return c
}

// get sends one request on c and reads its answer ("ok", or the error).
func get(c net.Conn, r *bufio.Reader) string {
	if _, err := io.WriteString(c, request); err != nil {
		return "error: " + err.Error()
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "error: " + err.Error()
	}
	return string(b)
}

// serveCapped serves l on a loopback port and returns its address and
// listener (its counts).
func serveCapped(t *testing.T, l Limits, h http.Handler) (string, *connlimit.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := l.Server(h, context.Background())
	cl := l.Listener(ln)
	done := make(chan struct{})
	go func() { _ = hs.Serve(cl); close(done) }()
	t.Cleanup(func() { hs.Close(); <-done })
	return ln.Addr().String(), cl
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })

// One host's idle keep-alive connections cannot keep a fresh client out:
// past the per-address cap its oldest idle connection gives way to its
// next one, and once the listener is full (four hosts at their cap) a
// newcomer from another address takes an idle connection's place from the
// heaviest. Before, the listener had only a total cap, and a fresh client
// waited until a flood connection closed (for good: the flood's requests
// kept them from idling out).
func TestKeepAliveFloodLeavesRoomForAFreshClient(t *testing.T) {
	l := Defaults
	l.MaxConns, l.MaxConnsPerAddr = 32, 8
	addr, cl := serveCapped(t, l, okHandler)
	// One host opens as many keep-alive connections as the listener takes,
	// each served once and then idle (the whole listener, before).
	flood := func(host string, n int) {
		for range n {
			c := dialFrom(t, host, addr)
			if got := get(c, bufio.NewReader(c)); got != "ok" {
				t.Fatalf("a flood request from %s: %q", host, got)
			}
		}
		if _, held := cl.Pool().Len(host + "/32"); held > 8 {
			t.Fatalf("%s holds %d connections, past its cap of 8", host, held)
		}
	}
	fresh := func(from string) {
		c := dialFrom(t, from, addr)
		if got := get(c, bufio.NewReader(c)); got != "ok" {
			t.Fatalf("a fresh client from %s while the flood holds: %q", from, got)
		}
	}
	flood("127.0.0.1", 32)
	fresh("127.0.0.9")
	// Three more hosts at their cap: the listener is full.
	for h := 2; h <= 4; h++ {
		flood(fmt.Sprintf("127.0.0.%d", h), 8)
	}
	if n, _ := cl.Pool().Len(""); n != 32 {
		t.Fatalf("%d connections, want the listener full (32)", n)
	}
	fresh("127.0.0.10") // sheds an idle one of the heaviest host
	fresh("127.0.0.1")  // takes the place of its own host's oldest idle one
	if shed, _ := cl.Pool().Counts(); shed == 0 {
		t.Fatal("nothing was shed")
	}
}

// A connection whose request is being served is never shed: past the
// caps, with nothing idle to take the place of, a new connection is closed
// at once (it does not wait), and the requests in progress complete.
func TestBusyConnectionsAreNotShed(t *testing.T) {
	l := Defaults
	l.MaxConns, l.MaxConnsPerAddr = 2, 2
	release, started := make(chan struct{}), make(chan struct{}, 2)
	addr, _ := serveCapped(t, l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "ok")
	}))
	busy := []net.Conn{dialFrom(t, "127.0.0.1", addr), dialFrom(t, "127.0.0.1", addr)}
	answers := make(chan string, 2)
	for _, c := range busy {
		go func() { answers <- get(c, bufio.NewReader(c)) }()
	}
	<-started
	<-started
	for _, from := range []string{"127.0.0.1", "127.0.0.2"} {
		c := dialFrom(t, from, addr)
		// Closed, not left waiting for a slot (until the guard's deadline).
		if got := get(c, bufio.NewReader(c)); !strings.HasPrefix(got, "error") || strings.Contains(got, "i/o timeout") {
			t.Fatalf("a third connection (from %s) while two requests are served: %q, want it closed at once", from, got)
		}
	}
	close(release)
	for range busy {
		if got := <-answers; got != "ok" {
			t.Fatalf("a request in progress: %q", got)
		}
	}
}

// TestEventsOutliveTheWriteTimeout: a stream's writes each get a deadline
// of their own, so events still arrive after the server's WriteTimeout has
// passed since the request, and each is flushed as it is sent.
func TestEventsOutliveTheWriteTimeout(t *testing.T) {
	next := make(chan string)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev := StartEvents(w, time.Minute)
		for msg := range next {
			if err := ev.Send([]byte("data: " + msg + "\n\n")); err != nil {
				return
			}
		}
	})
	srv := httptest.NewUnstartedServer(h)
	srv.Config.WriteTimeout = 50 * time.Millisecond
	srv.Start()
	defer srv.Close()
	defer close(next)
	resp, err := (&http.Client{Timeout: hangGuard}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct, cc := resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"); ct != "text/event-stream" || cc != "no-store" {
		t.Fatalf("headers: Content-Type %q, Cache-Control %q", ct, cc)
	}
	r := bufio.NewReader(resp.Body)
	for i := range 3 {
		// Past the server's write timeout, measured from the request: the
		// stream must still carry the event. (Waiting longer only makes
		// the check stricter; a slow machine cannot fail it.)
		time.Sleep(60 * time.Millisecond)
		msg := fmt.Sprint("event ", i)
		next <- msg
		line, err := r.ReadString('\n')
		if err != nil || line != "data: "+msg+"\n" {
			t.Fatalf("event %d: %q, %v", i, line, err)
		}
		if blank, _ := r.ReadString('\n'); blank != "\n" {
			t.Fatalf("event %d is not ended by a blank line: %q", i, blank)
		}
	}
}
