package web

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// heldBuild is a build the test lets finish: started receives once per
// build begun, and each build returns once release is closed.
type heldBuild struct {
	started chan struct{}
	release chan struct{}
	builds  atomic.Int32
}

func newHeldBuild() *heldBuild {
	return &heldBuild{started: make(chan struct{}, 16), release: make(chan struct{})}
}

// tinyModule is a module's smallest valid bytes, gzipped, as Build returns
// them.
func tinyModule(t *testing.T) *Module {
	raw := []byte("\x00asm\x01\x00\x00\x00")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return &Module{WasmGz: gz.Bytes(), ExecJS: []byte("globalThis.Go = class {};\n"), Size: len(raw)}
}

func (h *heldBuild) build(m *Module) func(context.Context, string) (*Module, error) {
	return func(ctx context.Context, _ string) (*Module, error) {
		h.builds.Add(1)
		h.started <- struct{}{}
		select {
		case <-h.release:
			return m, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// TestWaitingVisitorsOutlastTheWriteTimeout: visitors who ask for the
// module while it is built all get it once it is, however long after the
// server's write timeout that is. The module's first build takes longer
// than psyche server's 30 s write timeout, and the visitors who had asked
// early got a dropped connection (HTTP 000; 147 of 300 with a 35 s build).
// The build here is held back until the write deadline every waiting
// request was given has passed, which a canary request asked after them
// on the same server observes; the server's write timeout is short so
// that the test does not wait long for it.
func TestWaitingVisitorsOutlastTheWriteTimeout(t *testing.T) {
	const visitors = 300
	held := newHeldBuild()
	mod := tinyModule(t)
	p := NewPage(WithSource("the source"), WithBuild(held.build(mod)))
	mux := http.NewServeMux()
	p.Routes(mux)
	expired := make(chan struct{})
	mux.HandleFunc("GET /canary", func(w http.ResponseWriter, r *http.Request) {
		// Writes a byte at a time until the server's write deadline,
		// given when this request was read, refuses one.
		rc := http.NewResponseController(w)
		for {
			if _, err := w.Write([]byte{'.'}); err != nil {
				break
			}
			if err := rc.Flush(); err != nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		close(expired)
	})
	var entered sync.WaitGroup
	entered.Add(visitors)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/canary" {
			entered.Done()
		}
		mux.ServeHTTP(w, r)
	}))
	hs.Config.WriteTimeout = 100 * time.Millisecond
	hs.Start()
	defer hs.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan struct{})
	go func() { _ = p.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: visitors}}
	defer client.CloseIdleConnections()
	type answer struct {
		code int
		body []byte
		err  error
	}
	answers := make(chan answer, visitors)
	for range visitors {
		go func() {
			resp, err := client.Get(hs.URL + "/train/static/psyche.wasm")
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			answers <- answer{code: resp.StatusCode, body: body, err: err}
		}()
	}
	entered.Wait()
	<-held.started
	resp, err := client.Get(hs.URL + "/canary")
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	<-expired
	close(held.release)
	raw, _ := io.ReadAll(must(gzip.NewReader(bytes.NewReader(mod.WasmGz))))
	failed := 0
	for range visitors {
		a := <-answers
		if a.err != nil || a.code != http.StatusOK || !bytes.Equal(a.body, raw) {
			if failed++; failed <= 3 {
				t.Errorf("a visitor waiting for the module: HTTP %d, %d bytes, %v", a.code, len(a.body), a.err)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d waiting visitors got no module", failed, visitors)
	}
	if n := held.builds.Load(); n != 1 {
		t.Errorf("%d builds for %d visitors, want 1", n, visitors)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestPageBuildsOnFirstNeed: a server whose binary holds no module builds
// it when it is first needed, once: a federated run exists (Need), or a
// visitor asks for the page, the module or wasm_exec.js. Before, every
// server start ran the go command, federated runs or not; now one that
// only serves the page's other files never does.
func TestPageBuildsOnFirstNeed(t *testing.T) {
	for _, tc := range []struct {
		name string
		// need says the module is needed; what it asked has its answer
		// once answered is closed.
		need func(t *testing.T, p *Page, mux *http.ServeMux) (answered <-chan struct{})
	}{
		{"a federated run", func(_ *testing.T, p *Page, _ *http.ServeMux) <-chan struct{} { p.Need(); p.Need(); return closed() }},
		{"the page", func(t *testing.T, _ *Page, mux *http.ServeMux) <-chan struct{} {
			get(t, mux, "/train/some-run", http.StatusOK)
			return closed()
		}},
		{"the module", func(t *testing.T, _ *Page, mux *http.ServeMux) <-chan struct{} {
			return inBackground(func() { get(t, mux, "/train/static/psyche.wasm", http.StatusOK) })
		}},
		{"wasm_exec.js", func(t *testing.T, _ *Page, mux *http.ServeMux) <-chan struct{} {
			return inBackground(func() { get(t, mux, "/train/static/wasm_exec.js", http.StatusOK) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held := newHeldBuild()
			var log bytes.Buffer
			p := NewPage(WithSource("the source"), WithBuild(held.build(tinyModule(t))), WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
			mux := http.NewServeMux()
			p.Routes(mux)
			ran := make(chan struct{})
			go func() { _ = p.Run(t.Context()); close(ran) }()
			for _, f := range []string{"/train/static/app.js", "/train/static/worker.js", "/train/static/style.css"} {
				get(t, mux, f, http.StatusOK)
			}
			answered := tc.need(t, p, mux)
			<-held.started
			close(held.release)
			<-ran
			<-answered
			get(t, mux, "/train/static/psyche.wasm", http.StatusOK)
			<-tc.need(t, p, mux)
			if n := held.builds.Load(); n != 1 {
				t.Errorf("%d builds, want 1", n)
			}
			if !strings.Contains(log.String(), "when first needed") || !strings.Contains(log.String(), "building its WebAssembly module from the source") {
				t.Errorf("the log does not say the module is built on first need:\n%s", log.String())
			}
		})
	}
}

// TestPageWithoutNeedBuildsNothing: a server that stops before anything
// needed the module never built one, and says so to a late visitor.
func TestPageWithoutNeedBuildsNothing(t *testing.T) {
	held := newHeldBuild()
	p := NewPage(WithSource("the source"), WithBuild(held.build(tinyModule(t))))
	mux := http.NewServeMux()
	p.Routes(mux)
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{})
	go func() { _ = p.Run(ctx); close(ran) }()
	get(t, mux, "/train/static/app.js", http.StatusOK)
	cancel()
	<-ran
	if n := held.builds.Load(); n != 0 {
		t.Errorf("%d builds with nothing needing the module, want 0", n)
	}
	if body := get(t, mux, "/train/static/psyche.wasm", http.StatusNotFound); !strings.Contains(body, "stopped before") {
		t.Errorf("psyche.wasm after the server stopped: %q", body)
	}
}

// TestBrowserTrainerOff: with the browser trainer off (psyche server
// --browser-trainer=false) no build ever runs, and the page and every file
// under it answer 404 with the one line that says why.
func TestBrowserTrainerOff(t *testing.T) {
	const why = "the browser trainer is off on this server"
	held := newHeldBuild()
	var log bytes.Buffer
	p := NewPage(WithSource("the source"), WithBuild(held.build(tinyModule(t))), WithOff(why), WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	p.Need()
	mux := http.NewServeMux()
	p.Routes(mux)
	for _, path := range []string{"/train/some-run", "/train/static/app.js", "/train/static/worker.js", "/train/static/psyche.wasm", "/train/static/wasm_exec.js"} {
		if body := get(t, mux, path, http.StatusNotFound); strings.TrimSpace(body) != why {
			t.Errorf("%s: %q, want %q", path, body, why)
		}
	}
	if n := held.builds.Load(); n != 0 {
		t.Errorf("%d builds with the browser trainer off, want 0", n)
	}
	if !strings.Contains(log.String(), "the browser trainer is off") {
		t.Errorf("the log does not say the browser trainer is off:\n%s", log.String())
	}
}

// TestBuildTimeout: a build that outlasts its bound is stopped, and the
// visitors waiting for it are told so (not left waiting, nor cut off).
func TestBuildTimeout(t *testing.T) {
	p := NewPage(WithSource("the source"), WithBuildTimeout(time.Nanosecond),
		WithBuild(func(ctx context.Context, _ string) (*Module, error) { <-ctx.Done(); return nil, ctx.Err() }))
	mux := http.NewServeMux()
	p.Routes(mux)
	go func() { _ = p.Run(t.Context()) }()
	if body := get(t, mux, "/train/static/psyche.wasm", http.StatusNotFound); !strings.Contains(body, "took more than 1ns and was stopped") {
		t.Errorf("psyche.wasm after the build timed out: %q", body)
	}
}

func closed() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// inBackground runs f in a goroutine and closes the channel it returns
// when f returns.
func inBackground(f func()) <-chan struct{} {
	c := make(chan struct{})
	go func() { defer close(c); f() }()
	return c
}

// get asks mux for path and checks the answer's status.
func get(t *testing.T, mux *http.ServeMux, path string, want int) string {
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != want {
		t.Errorf("%s: HTTP %d, want %d: %s", path, rec.Code, want, rec.Body)
	}
	return rec.Body.String()
}

// TestBuildTimeIsTheDocs: the log line that starts a build and
// docs/browser.md state the first build's time in the same words (the log
// said "a minute or two", the doc "about 30 s").
func TestBuildTimeIsTheDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "browser.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), BuildTime) {
		t.Errorf("docs/browser.md does not state the first build's time as the log does: %q", BuildTime)
	}
}
