package torch

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestProtocolSidesAgree: the worker's protocol.py and this package read
// one protocol.json and come to the same values (the worker is run from
// the directory psyche writes it to, with the python tests use).
func TestProtocolSidesAgree(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	dir := t.TempDir()
	if err := writeWorker(dir); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, "-S", filepath.Join(dir, "protocol.py")).Output()
	if err != nil {
		t.Fatalf("protocol.py: %v", err)
	}
	var py struct {
		Version         int      `json:"version"`
		MinTorch        string   `json:"min_torch"`
		DefaultTimeoutS float64  `json:"default_timeout_s"`
		LogPrefix       string   `json:"log_prefix"`
		Kinds           []string `json:"kinds"`
		Ops             []string `json:"ops"`
	}
	if err := json.Unmarshal(out, &py); err != nil {
		t.Fatalf("protocol.py printed %q: %v", out, err)
	}
	ours, ops := sortedNames(goKinds), sortedNames(goOps)
	if py.Version != protocolVersion || py.MinTorch != MinTorch || py.LogPrefix != logPrefix ||
		py.DefaultTimeoutS != defaultTimeout.Seconds() || !slices.Equal(py.Kinds, ours) || !slices.Equal(py.Ops, ops) {
		t.Fatalf("the worker reads %+v; psyche: version %d, min torch %s, timeout %v, prefix %q, kinds %v, ops %v",
			py, protocolVersion, MinTorch, defaultTimeout, logPrefix, ours, ops)
	}
}

// TestProtocolFileChecked: a protocol.json that drops a kind psyche acts on,
// or declares one it does not know, or lacks a value, is refused (the
// embedded file is read at init, so the package's tests fail on it).
func TestProtocolFileChecked(t *testing.T) {
	good := string(protocolJSON)
	if _, err := parseProtocol([]byte(good)); err != nil {
		t.Fatalf("the embedded file: %v", err)
	}
	for name, bad := range map[string]string{
		"a kind dropped":   strings.Replace(good, `"nonfinite":`, `"x-nonfinite":`, 1),
		"no version":       strings.Replace(good, `"version":`, `"x-version":`, 1),
		"no timeout":       strings.Replace(good, `"default_timeout_s":`, `"x":`, 1),
		"not json":         good[:len(good)/2],
		"an unknown kind":  strings.Replace(good, `"kinds": {`, `"kinds": {"new": "?",`, 1),
		"no minimum torch": strings.Replace(good, `"min_torch":`, `"x-min":`, 1),
		"an op dropped":    strings.Replace(good, `"undo":`, `"x-undo":`, 1),
		"an unknown op":    strings.Replace(good, `"ops": {`, `"ops": {"new": "?",`, 1),
	} {
		if bad == good {
			t.Fatalf("%s: the replacement changed nothing", name)
		}
		if _, err := parseProtocol([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
