// Command nativebench trains a federated run's model on a text file for a
// number of local steps, natively, and prints tokens a second: the same
// code (federated/browser.Bench) the page runs as WebAssembly, so that
// scripts/test-browser can put the browser's speed beside this machine's.
//
//	go run ./federated/browser/nativebench --server URL --run ID --file F [--steps N]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/psyche-go/psyche/federated/browser"
)

func main() {
	server := flag.String("server", "http://127.0.0.1:7600", "the server's base URL")
	run := flag.String("run", "", "the federated run whose model is trained")
	file := flag.String("file", "", "the text to train on")
	steps := flag.Int("steps", 20, "local steps to time")
	batch := flag.Int("batch", browser.DefaultBatch, "sequences a step")
	flag.Parse()
	text, err := os.ReadFile(*file)
	if err == nil {
		var tps float64
		tps, err = browser.Bench(context.Background(), browser.Config{Server: *server, Run: *run, Name: filepath.Base(*file), Batch: *batch}, text, *steps)
		if err == nil {
			fmt.Printf("%.1f tokens/s\n", tps)
			return
		}
	}
	fmt.Fprintln(os.Stderr, "nativebench:", err)
	os.Exit(1)
}
