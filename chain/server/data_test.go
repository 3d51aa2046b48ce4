package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
