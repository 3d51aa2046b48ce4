// Command gen builds the browser trainer's generated files into
// ../static (go generate ./federated/browser/web runs it there): the
// WebAssembly module of federated/browser/wasm, gzipped, and the
// wasm_exec.js of the Go that builds it (the two must come from the same
// Go release).
package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "federated/browser/web: generating the WebAssembly module:", err)
		os.Exit(1)
	}
}

func run() error {
	tmp, err := os.MkdirTemp("", "psyche-wasm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	wasm := filepath.Join(tmp, "psyche.wasm")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", wasm, "../wasm")
	build.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm", "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}
	raw, err := os.ReadFile(wasm)
	if err != nil {
		return err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := zw.Write(raw); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := write("static/psyche.wasm.gz", gz.Bytes()); err != nil {
		return err
	}
	root, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return fmt.Errorf("go env GOROOT: %w", err)
	}
	js, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(root)), "lib", "wasm", "wasm_exec.js"))
	if err != nil {
		return err
	}
	if err := write("static/wasm_exec.js", js); err != nil {
		return err
	}
	fmt.Printf("federated/browser/web: psyche.wasm %.1f MiB (%.1f MiB gzipped), wasm_exec.js\n",
		float64(len(raw))/(1<<20), float64(gz.Len())/(1<<20))
	return nil
}

// write replaces name through a temporary file, so that a build that reads
// static/ meanwhile never embeds half a module.
func write(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}
