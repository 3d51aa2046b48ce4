// Package torchenv finds, for tests outside the torch engine, the python of
// the engine's pinned environment (scripts/setup-torch), the one that has
// transformers and tokenizers.
package torchenv

import (
	"os"
	"testing"

	"github.com/psyche-go/psyche/trainer/engine/torch"
)

// Python returns $PSYCHE_PYTHON, else the environment's python. Without one
// the test skips, except in CI (CI=true), where the environment is part of
// the set-up and its absence fails the test. needs names the package the
// test wants from it, for the message.
func Python(t testing.TB, needs string) string {
	t.Helper()
	if p := os.Getenv("PSYCHE_PYTHON"); p != "" {
		return p
	}
	if p := torch.SetupPython(); p != "" {
		return p
	}
	msg := "no python with " + needs + ": run bash scripts/setup-torch (scripts/test does), or set PSYCHE_PYTHON"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
