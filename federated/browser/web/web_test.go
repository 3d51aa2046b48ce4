package web

import (
	"bytes"
	"compress/gzip"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestTrainPageHeaders: the page and every file it loads carry a
// Content-Security-Policy (with 'wasm-unsafe-eval', which compiling the
// module in the worker needs: a worker's policy is its script's), nosniff,
// and frame-ancestors 'none'; they carried none (the explorer's page did).
func TestTrainPageHeaders(t *testing.T) {
	mux := http.NewServeMux()
	p := NewPage(WithSource(""))
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	p.Routes(mux)
	for _, path := range []string{"/train/some-run", "/train/static/app.js", "/train/static/worker.js", "/train/static/style.css",
		"/train/static/wasm_exec.js", "/train/static/psyche.wasm", "/train/static/nothing-here.js"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		h := rec.Result().Header
		csp := h.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "script-src 'self' 'wasm-unsafe-eval'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s (%d): Content-Security-Policy %q lacks %q", path, rec.Code, csp, want)
			}
		}
		if strings.Contains(csp, "'unsafe-eval'") || strings.Contains(csp, "*") {
			t.Errorf("%s: Content-Security-Policy %q allows more than the page needs", path, csp)
		}
		if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s: X-Content-Type-Options %q, want nosniff", path, got)
		}
		if got := h.Get("X-Frame-Options"); got != "DENY" {
			t.Errorf("%s: X-Frame-Options %q, want DENY", path, got)
		}
	}
}

// TestTrainPageFitsItsPolicy: what the page loads is what CSP allows: its
// scripts, styles and worker from the server itself, no inline script or
// handler, no other origin, and data: only for the icon (img-src).
func TestTrainPageFitsItsPolicy(t *testing.T) {
	html, err := files.ReadFile("static/index.html")
	if err != nil {
		t.Fatal(err)
	}
	page := string(html)
	if regexp.MustCompile(`<script(?:\s[^>]*)?>\s*[^<\s]`).MatchString(page) || regexp.MustCompile(`\son[a-z]+=`).MatchString(page) {
		t.Error("the page has an inline script or event handler, which script-src 'self' refuses")
	}
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		if u := m[1]; !strings.HasPrefix(u, "/train/static/") && u != "data:," {
			t.Errorf("the page loads %q: not the server's own", u)
		}
	}
	for _, name := range []string{"static/app.js", "static/worker.js"} {
		b, err := files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		for _, bad := range []string{"eval(", "new Function", "http://", "https://", "blob:"} {
			if strings.Contains(src, bad) {
				t.Errorf("%s uses %q, which the page's policy refuses", name, bad)
			}
		}
	}
}

// TestPageBuildsItsModule: a binary that holds no module (go build without
// go generate, as the README builds it) builds one from its source when the
// server starts, and a browser asking for it meanwhile waits for it, then
// gets a module that instantiates (wasm magic) and its wasm_exec.js; the
// log says so. Before, such a server answered 404 and logged nothing at
// INFO. The source here is a small program in the place of
// federated/browser/wasm: the real one's first build takes a minute of
// compiling, which scripts/test-browser pays once and then trains with.
func TestPageBuildsItsModule(t *testing.T) {
	if Included() {
		t.Skip("this test binary holds a generated module (go generate ran); the build path is not taken")
	}
	root := t.TempDir()
	write := func(name, text string) {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/tiny\n\ngo 1.26\n")
	write(WasmPackage+"/main.go", "package main\n\nfunc main() { println(\"trainer\") }\n")
	var log bytes.Buffer
	p := NewPage(WithSource(root), WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	mux := http.NewServeMux()
	p.Routes(mux)
	got := make(chan *httptest.ResponseRecorder)
	go func() {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/train/static/psyche.wasm", nil))
		got <- rec
	}()
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec := <-got
	if rec.Code != http.StatusOK {
		t.Fatalf("psyche.wasm: HTTP %d: %s", rec.Code, rec.Body)
	}
	if !bytes.HasPrefix(rec.Body.Bytes(), []byte("\x00asm")) {
		t.Errorf("psyche.wasm (asked without gzip) does not start with the WebAssembly magic: % x", rec.Body.Bytes()[:min(8, rec.Body.Len())])
	}
	req := httptest.NewRequest(http.MethodGet, "/train/static/psyche.wasm", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	zr, err := gzip.NewReader(rec.Body)
	if err != nil {
		t.Fatalf("psyche.wasm asked with gzip: %v", err)
	}
	if raw, _ := io.ReadAll(zr); !bytes.HasPrefix(raw, []byte("\x00asm")) {
		t.Error("psyche.wasm asked with gzip: not a gzipped module")
	}
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/train/static/wasm_exec.js", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "globalThis.Go") {
		t.Errorf("wasm_exec.js: HTTP %d, %d bytes without the Go class", rec.Code, rec.Body.Len())
	}
	for _, want := range []string{"building its WebAssembly module from the source", "module is built"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, log.String())
		}
	}
}

// TestPageWithoutModule: with no module and no source, the server says at
// start (WARN) that the page cannot train and how to fix it, and the
// page's module answers that one line.
func TestPageWithoutModule(t *testing.T) {
	if Included() {
		t.Skip("this test binary holds a generated module (go generate ran)")
	}
	var log bytes.Buffer
	p := NewPage(WithSource(""), WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	p.Routes(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/train/static/psyche.wasm", nil))
	if rec.Code != http.StatusNotFound || strings.TrimSpace(rec.Body.String()) != Missing {
		t.Errorf("psyche.wasm: HTTP %d %q, want 404 %q", rec.Code, rec.Body, Missing)
	}
	if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "go generate") {
		t.Errorf("the log does not warn that the page cannot train:\n%s", log.String())
	}
}

// TestSourceIsThisCheckout: a binary compiled without -trimpath (go test,
// go run, go build as the README runs them) finds the checkout it came from.
func TestSourceIsThisCheckout(t *testing.T) {
	root, ok := Source()
	if !ok {
		t.Fatal("Source found no checkout for a test binary compiled from one")
	}
	if _, err := os.Stat(filepath.Join(root, "federated", "browser", "web", "web.go")); err != nil {
		t.Errorf("Source() = %s, not this checkout: %v", root, err)
	}
}
