package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestJoinWithoutTorch: a trainer asked for the torch engine on a machine
// whose python lacks torch says so in one line, naming what to install,
// before it starts any networking (the server here is a port nobody
// listens on: had join dialled it first, that would be the error).
func TestJoinWithoutTorch(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id.json")
	if _, errs, code := psyche(t, "keygen", "--out", key); code != 0 {
		t.Fatal(errs)
	}
	for _, python := range []string{filepath.Join(dir, "no-such-python"), "/bin/false"} {
		// --python, not PSYCHE_PYTHON: urfave/cli keeps a value read from
		// the environment in the command's flag for later runs in this
		// process.
		out, errs, code := psyche(t, "join", "--engine", "torch", "--python", python, "--server", "http://127.0.0.1:1", "--key", key, "--run-id", "tiny",
			"--data-dir", dir)
		lines := strings.Split(strings.TrimSpace(errs), "\n")
		if code == 0 || len(lines) != 1 || !strings.Contains(errs, "torch") || !strings.Contains(errs, "install") ||
			strings.Contains(errs+out, "127.0.0.1:1") {
			t.Errorf("--python %s: exit %d, stderr %q, stdout %q: want one line naming what to install, before any networking",
				python, code, errs, out)
		}
	}
}

// TestEngineFlags: --engine takes go or torch (localnet a list), and
// --device and --devices belong to torch, one of them at a time.
func TestEngineFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"localnet", "--engine", "cuda"}, `--engine "cuda": want go or torch`},
		{[]string{"localnet", "--engine", "go", "--device", "cuda"}, "--device cuda is for --engine torch"},
		{[]string{"join", "--engine", "go,torch", "--run-id", "x"}, "a trainer has one engine"},
		{[]string{"localnet", "--engine", "torch", "--device", "gpu0"}, `device "gpu0": want cpu, cuda, cuda:N or mps`},
		{[]string{"localnet", "--engine", "go", "--devices", "cpu,cpu"}, "--devices cpu,cpu is for --engine torch"},
		{[]string{"localnet", "--engine", "torch", "--device", "cuda", "--devices", "cuda:0,cuda:1"}, "--device cuda and --devices cuda:0,cuda:1: give one"},
		{[]string{"localnet", "--engine", "torch", "--devices", "cuda:0,cpu"}, `devices "cuda:0,cpu": all cpu or all cuda:N, not both`},
		{[]string{"localnet", "--engine", "torch", "--devices", "cuda:1,cuda:1"}, "cuda:1 is named twice"},
		{[]string{"localnet", "--engine", "torch", "--devices", "cuda,cuda:1"}, `"cuda" cannot be one of several`},
		{[]string{"localnet", "--engine", "torch", "--devices", "all,cuda:1"}, "all stands alone"},
		{[]string{"localnet", "--engine", "go", "--placement", "shard"}, "--placement is for --engine torch"},
		{[]string{"localnet", "--engine", "torch", "--devices", "cpu,cpu", "--placement", "zero"}, `placement "zero": want auto, replicate or shard`},
		{[]string{"localnet", "--engine", "go", "--device-memory", "8GiB"}, "--device-memory is for --engine torch"},
		{[]string{"localnet", "--engine", "torch", "--device-memory", "8 gigs"}, "--device-memory 8 gigs: want a positive size: bytes, or a number with KiB, MiB, GiB or TiB"},
	} {
		_, errs, code := psyche(t, tc.args...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %q", tc.args, code, errs, tc.want)
		}
	}
}

var heldOutRE = regexp.MustCompile(`held-out loss: ([0-9.]+) -> ([0-9.]+)`)

// TestLocalnetEngines runs localnet on torch trainers alone (the loss falls,
// every trainer ends with the same weights) and on a mix of engines (one Go
// trainer, two torch ones: the loss falls).
func TestLocalnetEngines(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	for _, engines := range []string{"torch", "go,torch,torch"} {
		var out, errb bytes.Buffer
		code := run([]string{"psyche", "--log-level", "debug", "localnet", "--virtual-time", "--trainers", "3", "--epochs", "2", "--epoch-time", "6",
			"--engine", engines, "--explorer-addr", "", "--dir", t.TempDir()}, &out, &errb)
		got := out.String()
		if code != 0 {
			t.Fatalf("--engine %s: exit %d: %s\n%s", engines, code, tail(errb.String(), 150), got)
		}
		m := heldOutRE.FindStringSubmatch(got)
		// Trainers of one engine hold identical weights; engines may differ
		// in a parameter whose update's sign was within rounding of zero,
		// which the summary measures against its bound.
		same := strings.Contains(got, "trainers hold identical weights: true (torch: ") && !strings.Contains(got, "identical weights: false")
		if engines != "torch" {
			same = same && strings.Contains(got, "trainers hold identical weights: true (go: 1 trainer, hash ") &&
				regexp.MustCompile(`engines go and torch: (identical weights|.* within the bound of 1% of parameters)`).MatchString(got)
		}
		if m == nil || !same || !strings.Contains(got, "engine: torch") {
			t.Fatalf("--engine %s: the summary lacks a held-out loss, identical weights per engine, the engines' difference or the engine line:\n%s", engines, got)
		}
		before, _ := strconv.ParseFloat(m[1], 64)
		after, _ := strconv.ParseFloat(m[2], 64)
		t.Logf("--engine %s: held-out loss %.3f -> %.3f", engines, before, after)
		if after >= before-0.5 {
			t.Errorf("--engine %s: the loss did not fall: %.3f -> %.3f", engines, before, after)
		}
	}
}

// TestParseBytes: --device-memory's sizes.
func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"1024": 1024, "1KiB": 1 << 10, "512MiB": 512 << 20, "1.5GiB": 3 << 29, "2 TiB": 2 << 40, "7B": 7} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1GiB", "1GB", "GiB", "1e30TiB"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", in, got)
		}
	}
}
