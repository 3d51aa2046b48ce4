// Command sbpf-link links BPF relocatable objects (clang -target bpfel, see
// sbpf.ClangArgs) into an SBPFv0 shared object that Solana loads as a program.
//
//	go run ./programs/cmd/sbpf-link -o program.so a.o b.o
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/psyche-go/psyche/internal/atomicfile"
	"github.com/psyche-go/psyche/programs/sbpf"
)

func main() {
	out := flag.String("o", "", "output shared object (required)")
	entry := flag.String("entry", "entrypoint", "function the program starts at")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: sbpf-link [-entry name] -o out.so in.o...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, *entry, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "sbpf-link:", err)
		os.Exit(1)
	}
}

func run(out, entry string, inputs []string) error {
	var objects []sbpf.Object
	for _, path := range inputs {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		objects = append(objects, sbpf.Object{Name: path, Data: data})
	}
	so, err := sbpf.Link(objects, sbpf.WithEntry(entry))
	if err != nil {
		return err
	}
	// Write through a temporary file so a failed link never leaves a
	// truncated program behind for a later step to deploy.
	return atomicfile.WriteFile(out, so, 0o644)
}
