// Command gen builds the browser trainer's generated files into
// ../static (go generate ./federated/browser/web runs it there): the
// WebAssembly module of federated/browser/wasm, gzipped, and the
// wasm_exec.js of the Go that builds it (the two must come from the same
// Go release). A binary built with them holds the module; one built
// without them builds it from its source when its server starts.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/psyche-go/psyche/federated/browser/web"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "federated/browser/web: generating the WebAssembly module:", err)
		os.Exit(1)
	}
}

func run() error {
	m, err := web.Build(context.Background(), "../../..")
	if err != nil {
		return err
	}
	if err := write("static/psyche.wasm.gz", m.WasmGz); err != nil {
		return err
	}
	if err := write("static/wasm_exec.js", m.ExecJS); err != nil {
		return err
	}
	fmt.Printf("federated/browser/web: psyche.wasm %.1f MiB (%.1f MiB gzipped), wasm_exec.js\n",
		float64(m.Size)/(1<<20), float64(len(m.WasmGz))/(1<<20))
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
