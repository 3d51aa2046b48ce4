package httpserve

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
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

// Past MaxConns a new connection is not served until one of those open
// closes.
func TestConnectionCap(t *testing.T) {
	l := Defaults
	l.MaxConns = 2
	addr := serve(t, l)
	// Two connections that hold their slots: a request's first line and no
	// more (the header timeout is Defaults' 10 s).
	held := []net.Conn{dial(t, addr), dial(t, addr)}
	for _, c := range held {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	third := dial(t, addr)
	if _, err := io.WriteString(third, request); err != nil {
		t.Fatal(err)
	}
	answered := make(chan string, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(third), nil)
		if err != nil {
			answered <- "error: " + err.Error()
			return
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 2))
		answered <- string(b)
	}()
	// Not served while both slots are held. (A short look: this can only
	// miss a bug, never fail a correct server.)
	select {
	case got := <-answered:
		t.Fatalf("the third connection was served (%q) while the cap of 2 was held", got)
	case <-time.After(200 * time.Millisecond):
	}
	held[0].Close()
	if got := <-answered; !strings.HasPrefix(got, "ok") {
		t.Fatalf("the third connection after a slot freed: %q", got)
	}
}
