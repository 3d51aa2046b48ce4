// Package web is the browser trainer's page, served by psyche server at
// /train/<run>: the page (static/), a worker that runs the federated client
// compiled to WebAssembly (federated/browser/wasm), and Go's wasm_exec.js.
// The module and wasm_exec.js are not committed: a binary holds them when
// it was built after
//
//	go generate ./federated/browser/web
//
// and otherwise its server builds them from the source the binary was
// compiled from when they are first needed (Page.Run: a federated run
// exists, or a visitor asks for the page or the module), so that go run
// ./cmd/psyche server serves a page that trains. A binary with neither
// still serves the page, which then says how to build the module; a server
// may also turn the browser trainer off (WithOff), and then never builds.
package web

//go:generate go run ./gen

import (
	"bytes"
	"compress/gzip"
	"context"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/psyche-go/psyche/internal/httpserve"
)

//go:embed static
var files embed.FS

// wasmGz is the module's file: stored gzipped (a quarter of its size in
// the psyche binary, and what browsers are sent).
const wasmGz = "static/psyche.wasm.gz"

// Included says whether this binary holds the WebAssembly module.
func Included() bool {
	_, err := fs.Stat(files, wasmGz)
	return err == nil
}

// Missing is what the page says when the server has no module.
const Missing = "this server has no browser trainer's WebAssembly module (its binary holds none and it found no psyche source to build one from): " +
	"build one in with `go generate ./federated/browser/web && go build ./cmd/psyche`, or run the server from a psyche checkout with go on PATH"

// Page serves the browser trainer. Its module is the binary's own, or the
// one Run builds from the source when it is first needed; a request for
// the module waits for that build.
type Page struct {
	log          *slog.Logger
	source       string // the source to build from ("": none)
	build        func(ctx context.Context, root string) (*Module, error)
	buildTimeout time.Duration
	off          string // non-empty: the browser trainer is off, and every route answers this

	need     chan struct{} // closed by Need
	needOnce sync.Once
	ready    chan struct{}
	mod      *Module // once ready: the module, or nil
	why      string  // once ready without a module: what the page says
}

// DefaultBuildTimeout bounds the module's build: a first build takes
// about BuildTime, and one this much longer is stuck (a go command
// waiting on a network or a lock), so the server ends it and the page
// says why it cannot train. Visitors wait for the build at most this long.
const DefaultBuildTimeout = 10 * time.Minute

// BuildTime is how long the first build of the module takes (its
// dependencies compiled for WebAssembly; Go's build cache makes later
// builds about a second), as the server's log and docs/browser.md state
// it: measured as psyche server runs it, with an empty build cache and the
// module cache full (docs/browser.md, Figures).
const BuildTime = "about 40 s on an idle 2-core machine, up to 2 minutes on a busy one"

// Option configures a Page.
type Option func(*Page)

// WithLogger sets the page's logger.
func WithLogger(l *slog.Logger) Option { return func(p *Page) { p.log = l } }

// WithSource sets where a binary without the module builds it from
// (default: Source(); "" builds none).
func WithSource(root string) Option { return func(p *Page) { p.source = root } }

// WithBuild replaces Build as what compiles the module from the source
// (tests hold a build back to see what waits for it).
func WithBuild(build func(ctx context.Context, root string) (*Module, error)) Option {
	return func(p *Page) { p.build = build }
}

// WithBuildTimeout bounds the module's build (default DefaultBuildTimeout).
func WithBuildTimeout(d time.Duration) Option { return func(p *Page) { p.buildTimeout = d } }

// WithOff turns the browser trainer off: no module is built or served,
// and the page and every file under it answer 404 with why (a server that
// trusts no go command at run time, or serves no browsers).
func WithOff(why string) Option { return func(p *Page) { p.off = why } }

// NewPage returns the page, with the binary's module if it holds one.
func NewPage(opts ...Option) *Page {
	p := &Page{log: slog.New(slog.DiscardHandler), build: Build, buildTimeout: DefaultBuildTimeout,
		need: make(chan struct{}), ready: make(chan struct{})}
	p.source, _ = Source()
	for _, o := range opts {
		o(p)
	}
	if p.off != "" {
		p.why = p.off
		close(p.ready)
		return p
	}
	if gz, err := files.ReadFile(wasmGz); err == nil {
		js, _ := files.ReadFile("static/wasm_exec.js")
		p.mod = &Module{WasmGz: gz, ExecJS: js}
		close(p.ready)
	}
	return p
}

// Need says that the module is needed: a federated run exists, or a
// visitor asked for the page or the module. The first call starts Run's
// build (if the binary holds no module); later ones do nothing. It never
// blocks.
func (p *Page) Need() { p.needOnce.Do(func() { close(p.need) }) }

// Run says in the log whether the page has a module and, when the binary
// holds none, builds it from the source once Need is first called (a
// server with no federated run and no visitor runs no go command). It
// returns once the page's module is settled (built, or the build failed: a
// failure is logged, the page goes on serving and says why it cannot
// train) or ctx ends.
func (p *Page) Run(ctx context.Context) error {
	select {
	case <-p.ready:
		if p.off != "" {
			p.log.Info("the browser trainer is off: /train/<run> answers that it is, and no WebAssembly module is built", "why", p.off)
			return nil
		}
		p.log.Info("the browser trainer is served at /train/<run> (its WebAssembly module is built into this binary)")
		return nil
	default:
	}
	defer close(p.ready)
	if p.source == "" {
		p.why = Missing
		p.log.Warn("the browser trainer at /train/<run> cannot train: " + Missing)
		return nil
	}
	p.log.Info("the browser trainer is served at /train/<run>; its WebAssembly module will be built from the source when first needed (a federated run, or a visitor)",
		"source", p.source)
	select {
	case <-p.need:
	case <-ctx.Done():
		p.why = "the server stopped before the browser trainer's module was built"
		return nil
	}
	p.log.Info("the browser trainer is needed: building its WebAssembly module from the source (the binary holds none; a first build takes "+BuildTime+", later ones about a second)",
		"source", p.source)
	start := time.Now()
	bctx, cancel := context.WithTimeout(ctx, p.buildTimeout)
	defer cancel()
	m, err := p.build(bctx, p.source)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			p.why = "the server stopped before the browser trainer's module was built"
			return nil
		case bctx.Err() != nil:
			p.why = fmt.Sprintf("building the browser trainer's WebAssembly module took more than %v and was stopped (restart the server to try again)", p.buildTimeout)
		default:
			p.why = "building the browser trainer's WebAssembly module failed: " + err.Error()
		}
		p.log.Warn("the browser trainer at /train/<run> cannot train: "+p.why, "source", p.source)
		return nil
	}
	p.mod = m
	mib := func(n int) float64 { return math.Round(float64(n)/(1<<20)*100) / 100 }
	p.log.Info("the browser trainer's WebAssembly module is built", "mib", mib(m.Size),
		"gzipped_mib", mib(len(m.WasmGz)), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// module waits for the page's module (nil: none, and why; false: the
// client left first), starting its build if none has started.
//
// The server's write timeout (30 s) counts from the request, and a first
// build takes longer: a visitor who asked early had its connection cut
// when the answer was finally written. So a request that waits moves its
// own write deadline past the longest the build may take, and once the
// module is settled gives the answer the server's usual time from then.
func (p *Page) module(w http.ResponseWriter, r *http.Request) (*Module, string, bool) {
	select {
	case <-p.ready:
		return p.mod, p.why, true
	default:
	}
	p.Need()
	rc := http.NewResponseController(w)
	// (ErrNotSupported, from a writer that has no deadline, leaves nothing
	// to move.)
	_ = rc.SetWriteDeadline(time.Now().Add(p.buildTimeout + httpserve.Defaults.Write))
	select {
	case <-p.ready:
		_ = rc.SetWriteDeadline(time.Now().Add(httpserve.Defaults.Write))
		return p.mod, p.why, true
	case <-r.Context().Done():
		return nil, "", false
	}
}

// CSP is the Content-Security-Policy of the page and of every file it
// loads (a worker's policy is its script's): the explorer's, with what the
// trainer needs besides — 'wasm-unsafe-eval' to compile the module (in the
// worker; no script is evaluated from text), and nothing may frame it
// (frame-ancestors: a page that trains on the visitor's files and sends
// updates must not be dressed up by another site's). Its scripts, styles,
// module and API calls are the server's own ('self').
const CSP = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// secure sets the headers every response under /train carries.
func secure(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY") // frame-ancestors for browsers that predate it
	h.Set("Referrer-Policy", "no-referrer")
}

// Routes adds the page to mux (chain/server's WithRoutes).
func (p *Page) Routes(mux *http.ServeMux) {
	static, _ := fs.Sub(files, "static")
	assets := http.StripPrefix("/train/static/", http.FileServerFS(static))
	mux.HandleFunc("GET /train/{run}", func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		if p.off != "" {
			http.Error(w, p.off, http.StatusNotFound)
			return
		}
		// The page asks for the module next: its build starts now.
		p.Need()
		b, err := files.ReadFile("static/index.html")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(b)
	})
	mux.HandleFunc("GET /train/static/{file}", func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		if p.off != "" {
			http.Error(w, p.off, http.StatusNotFound)
			return
		}
		switch r.PathValue("file") {
		case "psyche.wasm", "wasm_exec.js":
			m, why, ok := p.module(w, r)
			if !ok {
				return // the client left
			}
			if m == nil {
				http.Error(w, why, http.StatusNotFound)
				return
			}
			w.Header().Set("Cache-Control", "no-cache")
			if r.PathValue("file") == "wasm_exec.js" {
				w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
				_, _ = w.Write(m.ExecJS)
				return
			}
			serveWasm(w, r, m.WasmGz)
			return
		case "psyche.wasm.gz":
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		assets.ServeHTTP(w, r)
	})
}

// serveWasm sends the module gzipped to browsers that accept it (all do),
// and inflated to anything else.
func serveWasm(w http.ResponseWriter, r *http.Request, gz []byte) {
	w.Header().Set("Content-Type", "application/wasm")
	w.Header().Set("Vary", "Accept-Encoding")
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Length", strconv.Itoa(len(gz)))
		_, _ = w.Write(gz)
		return
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = io.Copy(w, zr)
}
