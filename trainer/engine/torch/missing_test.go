package torch

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMissingModulesNamedTogether: a python with neither numpy nor torch
// is told to install both in one line (it named numpy alone, the first
// import that failed, and the user found torch missing on the next try).
// The worker says so in its answer to hello (a kindMissing failure naming
// the modules), from the standard library alone.
func TestMissingModulesNamedTogether(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	// The same python without its site packages (-S): numpy and torch,
	// never part of the standard library, are both missing there.
	bare := filepath.Join(t.TempDir(), "bare-python")
	if err := os.WriteFile(bare, []byte("#!/bin/sh\nexec "+python+" -S \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	op, err := New(WithPython(bare))
	if err != nil {
		t.Fatal(err)
	}
	_, err = op.Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), bare+" lacks numpy and torch") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a python without numpy and torch: %v; want one line saying it lacks numpy and torch", err)
	}
}

// TestOldTorchRefused: Debian bookworm's torch (1.13, in /usr/bin/python3
// once python3-torch is installed, as scripts/test does) is refused in one
// line that names its version and the minimum (protocol.json's
// min_torch), and says what to run.
func TestOldTorchRefused(t *testing.T) {
	const debian = "/usr/bin/python3"
	out, err := exec.Command(debian, "-c", "import torch; print(torch.__version__)").Output()
	if err != nil || !strings.HasPrefix(string(out), "1.") {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s has no torch 1.x (%q, %v): scripts/test installs Debian's python3-torch for this test", debian, out, err)
		}
		t.Skipf("%s has no torch 1.x to refuse (apt-get install python3-torch)", debian)
	}
	op, err := New(WithPython(debian))
	if err != nil {
		t.Fatal(err)
	}
	_, err = op.Check(context.Background())
	want := debian + " has torch " + strings.TrimSpace(string(out)) + ", older than " + MinTorch
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "scripts/setup-torch") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Debian's torch: %v; want one line with %q and what to run", err, want)
	}
	t.Log(err)
}
