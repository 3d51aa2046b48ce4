package sbpf

import (
	"path/filepath"
	"testing"
)

// FuzzLink feeds mutated objects to the linker: objects come from outside
// (a compiler, a file), so Link must return an error, never panic or
// allocate without bound.
func FuzzLink(f *testing.F) {
	for _, name := range []string{"syscall", "rodata", "call", "fnptr", "bad_mutable", "bad_undefined"} {
		for _, obj := range readObjects(f, name) {
			f.Add(obj.Data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		so, err := Link([]Object{{Name: filepath.Join("fuzz", "input.o"), Data: data}})
		if err == nil && len(so) == 0 {
			t.Fatal("empty output without an error")
		}
	})
}
