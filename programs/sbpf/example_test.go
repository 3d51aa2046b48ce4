package sbpf_test

import (
	"bytes"
	"debug/elf"
	"fmt"
	"log"
	"os"

	"github.com/psyche-go/psyche/programs/sbpf"
)

// Linking a program that logs through the sol_log_ syscall: the call stays a
// dynamic relocation for the loader to bind by name.
func ExampleLink() {
	obj, err := os.ReadFile("testdata/syscall/hello.o")
	if err != nil {
		log.Fatal(err)
	}
	so, err := sbpf.Link([]sbpf.Object{{Name: "hello.o", Data: obj}})
	if err != nil {
		log.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(so))
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range f.Sections[1:] {
		fmt.Println(s.Name)
	}
	syms, _ := f.DynamicSymbols()
	for _, s := range syms {
		fmt.Println("dynamic symbol:", s.Name)
	}
	// Output:
	// .text
	// .rodata
	// .dynamic
	// .dynsym
	// .dynstr
	// .rel.dyn
	// .shstrtab
	// dynamic symbol: entrypoint
	// dynamic symbol: sol_log_
}
