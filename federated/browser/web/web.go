// Package web is the browser trainer's page, served by psyche server at
// /train/<run>: the page (static/), a worker that runs the federated client
// compiled to WebAssembly (federated/browser/wasm), and Go's wasm_exec.js.
// The module and wasm_exec.js are generated, not committed:
//
//	go generate ./federated/browser/web && go build ./cmd/psyche
//
// A binary built without them still serves the page, which then says how to
// build them (Included reports which).
package web

//go:generate go run ./gen

import (
	"bytes"
	"compress/gzip"
	"embed"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
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

// Missing is what the page says when the module is not built into the
// server.
const Missing = "this server was built without the browser trainer's WebAssembly module: build it with `go generate ./federated/browser/web && go build ./cmd/psyche`"

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
func Routes(mux *http.ServeMux) {
	static, _ := fs.Sub(files, "static")
	assets := http.StripPrefix("/train/static/", http.FileServerFS(static))
	mux.HandleFunc("GET /train/{run}", func(w http.ResponseWriter, r *http.Request) {
		secure(w)
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
		switch r.PathValue("file") {
		case "psyche.wasm":
			serveWasm(w, r)
			return
		case "wasm_exec.js":
			if _, err := fs.Stat(files, "static/wasm_exec.js"); err != nil {
				http.Error(w, Missing, http.StatusNotFound)
				return
			}
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
func serveWasm(w http.ResponseWriter, r *http.Request) {
	gz, err := files.ReadFile(wasmGz)
	if err != nil {
		http.Error(w, Missing, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/wasm")
	w.Header().Set("Cache-Control", "no-cache")
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
