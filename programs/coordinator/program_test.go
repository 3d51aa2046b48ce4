package coordinator_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	program "github.com/psyche-go/psyche/programs/coordinator"
)

// TestProgramIsReproducible rebuilds coordinator.so from src/ with the pinned
// clang and the repository's linker and requires the committed bytes.
func TestProgramIsReproducible(t *testing.T) {
	if _, err := exec.LookPath("clang-22"); err != nil && os.Getenv("CLANG") == "" {
		t.Skip("clang-22 is not installed (apt-get install -y clang-22): cannot rebuild coordinator.so")
	}
	out := filepath.Join(t.TempDir(), "coordinator.so")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "scripts/build-program", "programs/coordinator/src", out)
	cmd.Dir = filepath.Join("..", "..")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/build-program: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, program.Program) {
		t.Fatalf("coordinator.so is stale: the rebuild from src/ gives %d different bytes (committed %d); run scripts/build-program",
			len(got), len(program.Program))
	}
}
