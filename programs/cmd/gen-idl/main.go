// Command gen-idl writes the coordinator program's Anchor-style IDL from the
// Go definitions (see programs/coordinator.IDL):
//
//	go run ./programs/cmd/gen-idl [-o programs/coordinator/idl.json]
package main

import (
	"flag"
	"fmt"
	"os"

	program "github.com/psyche-go/psyche/programs/coordinator"
)

func main() {
	out := flag.String("o", "programs/coordinator/idl.json", "output file")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen-idl:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	idl, err := program.IDL()
	if err != nil {
		return err
	}
	return os.WriteFile(out, idl, 0o644)
}
