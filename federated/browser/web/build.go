package web

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Module is the browser trainer's WebAssembly module, gzipped, and the
// wasm_exec.js of the Go release that built it (the two must match).
type Module struct {
	WasmGz []byte
	ExecJS []byte
	Size   int // the module's size before gzip
}

// WasmPackage is the module's main package, relative to the repository.
const WasmPackage = "federated/browser/wasm"

// Build compiles the module from the psyche source at root (a repository
// holding WasmPackage) with the go command on PATH. It is what go generate
// runs, and what a server whose binary holds no module runs when the
// module is first needed (Page.Run): the Go build cache makes every build
// after the first take about a second. It trusts what such a go command
// does: the files under root (go.mod, the package's sources), the go
// found on PATH at run time and its toolchain, and the module cache or
// proxy it reads dependencies from.
func Build(ctx context.Context, root string) (*Module, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, errors.New("no go command on PATH to build it with")
	}
	tmp, err := os.MkdirTemp("", "psyche-wasm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	wasm := filepath.Join(tmp, "psyche.wasm")
	build := exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-ldflags=-s -w", "-o", wasm, "./"+WasmPackage)
	build.Dir = root
	build.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm", "CGO_ENABLED=0")
	var out bytes.Buffer
	build.Stdout, build.Stderr = &out, &out
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("go build ./%s in %s failed (%v): %s", WasmPackage, root, err, strings.TrimSpace(out.String()))
	}
	raw, err := os.ReadFile(wasm)
	if err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	env := exec.CommandContext(ctx, goCmd, "env", "GOROOT")
	env.Dir = root
	goroot, err := env.Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOROOT: %w", err)
	}
	js, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(goroot)), "lib", "wasm", "wasm_exec.js"))
	if err != nil {
		return nil, fmt.Errorf("the Go release at %s has no lib/wasm/wasm_exec.js: %w", strings.TrimSpace(string(goroot)), err)
	}
	return &Module{WasmGz: gz.Bytes(), ExecJS: js, Size: len(raw)}, nil
}

// Source is the root of the psyche source this binary was compiled from,
// if it is still there (ok false otherwise): what go run ./cmd/psyche and
// go build ./cmd/psyche leave behind. A -trimpath binary records no
// directory, and one copied to another machine finds none; both need the
// module built in (go generate).
func Source() (root string, ok bool) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", false
	}
	root = filepath.Join(filepath.Dir(file), "..", "..", "..")
	if _, err := os.Stat(filepath.Join(root, WasmPackage, "main.go")); err != nil {
		return "", false
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", false
	}
	return filepath.Clean(root), true
}
