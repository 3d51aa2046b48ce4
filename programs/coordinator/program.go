package coordinator

import (
	_ "embed"
)

// Program is the SBPF shared object of the coordinator program, built from
// src/*.c by scripts/build-program (clang-22 and the repository's linker).
// TestProgramIsReproducible rebuilds it and fails if the bytes differ.
//
//go:embed coordinator.so
var Program []byte
