package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/internal/floodtest"
)

// serveDataDir runs a server over a fresh state directory serving data at
// a real listener, and returns its address.
func serveDataDir(t *testing.T, data string, opts ...Option) string {
	t.Helper()
	s, err := New(t.TempDir(), append([]Option{WithData(data), WithManualTicks()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return serveLocal(t, s)
}

// rawGet sends a request line exactly as written (no client cleans the
// path) and returns the response.
func rawGet(t *testing.T, addr, method, target string, header ...string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n", method, target)
	for _, h := range header {
		req += h + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

// TestServeData: the data directory's files are served read-only with
// ranges; no path (.., encoded .., absolute, hidden, a symbolic link out)
// reads anything outside it.
func TestServeData(t *testing.T) {
	base := t.TempDir()
	data, outside := filepath.Join(base, "data"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(data, "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "SECRET outside the data directory"
	files := map[string]string{
		filepath.Join(data, "tokens.bin"):         "0123456789",
		filepath.Join(data, "sub", "shard 0.bin"): "shard",
		filepath.Join(data, ".hidden"):            secret,
		filepath.Join(outside, "secret"):          secret,
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"out": outside, "out.bin": filepath.Join(outside, "secret"),
		"in.bin": "tokens.bin"} {
		if err := os.Symlink(target, filepath.Join(data, link)); err != nil {
			t.Fatal(err)
		}
	}
	addr := serveDataDir(t, data)
	for _, tc := range []struct {
		method, target string
		header         []string
		status         int
		body           string
	}{
		{"GET", "/data/tokens.bin", nil, 200, "0123456789"},
		{"GET", "/data/tokens.bin", []string{"Range: bytes=2-5"}, 206, "2345"},
		{"HEAD", "/data/tokens.bin", nil, 200, ""},
		{"GET", "/data/sub/shard%200.bin", nil, 200, "shard"},
		{"GET", "/data/in.bin", nil, 200, "0123456789"}, // a link inside the directory
		{"GET", "/data/../outside/secret", nil, 400, ""},
		{"GET", "/data/%2e%2e/outside/secret", nil, 400, ""},
		{"GET", "/data/%2E%2E%2Foutside%2Fsecret", nil, 400, ""},
		{"GET", "/data/sub/../../outside/secret", nil, 400, ""},
		{"GET", "/data//etc/passwd", nil, 400, ""},
		{"GET", "/data/" + strings.TrimPrefix(filepath.Join(outside, "secret"), "/"), nil, 404, ""},
		{"GET", "/data/.hidden", nil, 400, ""},
		{"GET", "/data/out/secret", nil, 404, ""},
		{"GET", "/data/out.bin", nil, 404, ""},
		{"GET", "/data/sub", nil, 404, ""},
		{"GET", "/data/missing.bin", nil, 404, ""},
		{"POST", "/data/tokens.bin", nil, 405, ""},
	} {
		resp, body := rawGet(t, addr, tc.method, tc.target, tc.header...)
		if resp.StatusCode != tc.status || (tc.body != "" && body != tc.body) || strings.Contains(body, secret) {
			t.Errorf("%s %s: %s %q, want %d %q", tc.method, tc.target, resp.Status, body, tc.status, tc.body)
		}
		if tc.method == "HEAD" && resp.ContentLength != 10 {
			t.Errorf("HEAD: Content-Length %d", resp.ContentLength)
		}
	}
	// The API beside it is untouched.
	if resp, body := rawGet(t, addr, "GET", "/healthz"); resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("/healthz: %s %q", resp.Status, body)
	}
}

// TestServeDataPerAddressCap: a read past an address's cap of reads in
// flight is answered 429 with Retry-After (a trainer's reader backs off).
func TestServeDataPerAddressCap(t *testing.T) {
	data := t.TempDir()
	// Larger than the sockets' buffers: a reader that stops reading holds
	// its read in flight.
	big := filepath.Join(data, "big.bin")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 64<<20); err != nil {
		t.Fatal(err)
	}
	addr := serveDataDir(t, data, WithDataLimits(8, 1))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /data/big.bin HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// The headers come once the read holds its place.
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first read: %v %v", resp, err)
	}
	second, _ := rawGet(t, addr, "GET", "/data/big.bin", "Range: bytes=0-0")
	if second.StatusCode != http.StatusTooManyRequests || second.Header.Get("Retry-After") == "" {
		t.Fatalf("a second read from the address: %s (Retry-After %q), want 429 with Retry-After", second.Status, second.Header.Get("Retry-After"))
	}
}

// TestDataDirMustNotOverlapState: the state directory (the server's and the
// p2p host's keys) is never served.
func TestDataDirMustNotOverlapState(t *testing.T) {
	base := t.TempDir()
	state := filepath.Join(base, "state")
	for _, data := range []string{state, base, filepath.Join(state, "data")} {
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := New(state, WithData(data)); err == nil || !strings.Contains(err.Error(), "overlap") {
			t.Errorf("data %s, state %s: %v", data, state, err)
		}
	}
	if _, err := New(state, WithData(filepath.Join(base, "missing"))); err == nil || !strings.Contains(err.Error(), "data directory") {
		t.Errorf("a missing data directory: %v", err)
	}
	if _, err := New(state, WithData(filepath.Join(base, "ok"))); err == nil {
		t.Error("a data directory that does not exist was accepted")
	}
	if err := os.Mkdir(filepath.Join(base, "ok"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := New(state, WithData(filepath.Join(base, "ok"))); err != nil {
		t.Errorf("a separate data directory: %v", err)
	}
}

// bigDataDir is a data directory holding big.bin, a sparse file larger than
// the sockets' buffers: a reader that stops reading holds its read in
// flight.
func bigDataDir(t *testing.T, size int64) string {
	t.Helper()
	data := t.TempDir()
	big := filepath.Join(data, "big.bin")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, size); err != nil {
		t.Fatal(err)
	}
	return data
}

// startRead sends GET target from the source address from and returns the
// response once its headers are in (the read has begun writing), with its
// body unread. The connection closes with the test.
func startRead(t *testing.T, addr, from, target string) *http.Response {
	t.Helper()
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(floodGuard))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", target); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s from %s: %v", target, from, err)
	}
	return resp
}

// TestServeDataShedsTheHeaviestSlowReader: reads that their clients do not
// take hold every place of the data server, three from one address and one
// from another; a fresh address's read is served all the same, in the
// place of the heaviest address's oldest read, whose connection closes;
// the lighter address keeps its read. Before, the fresh address got 429
// for as long as the slow reads lasted.
func TestServeDataShedsTheHeaviestSlowReader(t *testing.T) {
	const size = 64 << 20
	// No read time to speak of: the reads that are not shed are read to
	// their end at the test's pace.
	s, err := New(t.TempDir(), WithData(bigDataDir(t, size)), WithDataLimits(4, 3), WithDataReadTime(time.Hour, 1), WithManualTicks())
	if err != nil {
		t.Fatal(err)
	}
	addr := serveLocal(t, s)
	var heavy []*http.Response
	for range 3 {
		heavy = append(heavy, startRead(t, addr, "127.0.0.2", "/data/big.bin"))
	}
	light := startRead(t, addr, "127.0.0.3", "/data/big.bin")
	for _, r := range append(heavy, light) {
		if r.StatusCode != http.StatusOK {
			t.Fatalf("a slow read within the caps: %s", r.Status)
		}
	}
	pool := s.cfg.data.reads
	if total, _ := pool.Len(""); total != 4 {
		t.Fatalf("%d reads in flight, want 4", total)
	}
	_, status, err := floodtest.Get(context.Background(), addr, "127.0.0.4", "/data/big.bin", floodGuard)
	if err != nil || status != http.StatusOK {
		t.Fatalf("a fresh address's read while the slow reads hold every place: %d %v", status, err)
	}
	if _, held := pool.Len("127.0.0.2/32"); held != 2 {
		t.Errorf("the heaviest address holds %d reads, want 2 (one shed)", held)
	}
	if _, held := pool.Len("127.0.0.3/32"); held != 1 {
		t.Errorf("the lighter address holds %d reads, want its 1", held)
	}
	if shed, _ := pool.Counts(); shed != 1 {
		t.Errorf("%d reads shed, want 1", shed)
	}
	// The shed read's connection is closed: its body ends short, while the
	// others, read now, come whole.
	short := 0
	for _, r := range heavy {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil || n != size {
			short++
		}
	}
	if short != 1 {
		t.Errorf("%d of the heaviest address's reads ended short, want 1 (the shed one)", short)
	}
}

// TestServeDataReadTime: a read that takes longer than its deadline, or
// reads slower than the minimum rate, has its connection closed before
// its reader has had the file (the server's own write timeout is an hour
// here, so only the read's bounds end it).
func TestServeDataReadTime(t *testing.T) {
	const size = 1 << 30
	data := bigDataDir(t, size)
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		minRate  int
	}{
		{"deadline", 300 * time.Millisecond, 1},
		{"minimum rate", time.Hour, 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveDataDir(t, data, WithDataReadTime(tc.deadline, tc.minRate),
				WithHTTPTimeouts(time.Hour, time.Hour, time.Hour))
			resp := startRead(t, addr, "127.0.0.1", "/data/big.bin")
			// 16 KiB a millisecond at most: the whole file would take
			// over a minute.
			buf := make([]byte, 16<<10)
			var got int64
			var err error
			for err == nil {
				var n int
				n, err = resp.Body.Read(buf)
				got += int64(n)
				time.Sleep(time.Millisecond)
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the slow read was not cut off in %v", floodGuard)
			}
			if err == io.EOF || got >= size {
				t.Fatalf("the slow reader had the whole file (%d bytes)", got)
			}
		})
	}
}
