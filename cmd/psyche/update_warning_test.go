package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestUpdateWarnsOfOneLyingWitness: psyche update warns when a run's rounds
// can have fewer than 3 witnesses, where the quorum is every witness and
// one lying witness can drop an honest trainer (with 2 witnesses a round,
// one did, and nothing told the run's creator); the update still goes
// through. A run whose every round has 3 witnesses or more gets no
// warning.
func TestUpdateWarnsOfOneLyingWitness(t *testing.T) {
	url, _ := startServer(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "admin.json")
	if _, errs, code := psyche(t, "keygen", "--out", key); code != 0 {
		t.Fatalf("keygen: %s", errs)
	}
	as := func(args ...string) (string, string, int) {
		return psyche(t, append(args, "--server", url, "--key", key, "--run-id", "wit")...)
	}
	if _, errs, code := as("init-coordinator"); code != 0 {
		t.Fatalf("init: %s", errs)
	}
	tiny, err := os.ReadFile(filepath.Join("..", "..", "examples", "tiny-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	runFile := func(minClients, witnesses string) string {
		s := regexp.MustCompile(`(?m)^min_clients = \d+`).ReplaceAllString(string(tiny), "min_clients = "+minClients)
		s = regexp.MustCompile(`(?m)^witness_nodes = \d+`).ReplaceAllString(s, "witness_nodes = "+witnesses)
		path := filepath.Join(dir, "run-"+minClients+"-"+witnesses+".toml")
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		minClients, witnesses string
		warn                  []string // what the warning says; none if empty
	}{
		{"2", "0", []string{"min_clients = 2", "2 witnesses", "2 of 2", "one lying witness can drop an honest trainer", "raise min_clients to at least 3"}},
		{"3", "2", []string{"witness_nodes = 2", "2 of 2", "set witness_nodes to at least 3"}},
		{"1", "0", []string{"1 witness", "1 of 1", "vouch alone"}},
		{"3", "0", nil},
		{"3", "3", nil},
	} {
		out, errs, code := as("update", "--config", runFile(tc.minClients, tc.witnesses))
		if code != 0 || !strings.Contains(out, "update: ok") {
			t.Fatalf("min_clients %s, witness_nodes %s: the update failed: %d %s %s", tc.minClients, tc.witnesses, code, out, errs)
		}
		if len(tc.warn) == 0 {
			if strings.Contains(errs, "warning") {
				t.Errorf("min_clients %s, witness_nodes %s: %s", tc.minClients, tc.witnesses, errs)
			}
			continue
		}
		for _, want := range append([]string{"warning: "}, tc.warn...) {
			if !strings.Contains(errs, want) {
				t.Errorf("min_clients %s, witness_nodes %s: the warning lacks %q: %q", tc.minClients, tc.witnesses, want, errs)
			}
		}
	}
}

// TestExamplesPassUpdateWithoutWarnings runs update's checks over every run
// file in examples/: each loads, and none draws a warning (tiny-run.toml and
// federated-run.toml both did, so the README's first update warned). A
// federated run's file is not warned of its witnesses: it has none (the
// server aggregates), so only the same [config] without [federated] is.
func TestExamplesPassUpdateWithoutWarnings(t *testing.T) {
	// From the root, as a user runs them: a transformers example names its
	// config.json relative to it.
	t.Chdir(filepath.Join("..", ".."))
	files, err := filepath.Glob(filepath.Join("examples", "*.toml"))
	if err != nil || len(files) < 6 {
		t.Fatalf("examples/*.toml: %d files, %v", len(files), err)
	}
	for _, path := range files {
		u, err := loadRunFile(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		fed, err := loadFederated(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if w := updateWarning(u, fed); w != "" {
			t.Errorf("%s: update warns: %s", path, w)
		}
		if fed != nil && u.Config != nil && u.Config.MinClients < 3 && updateWarning(u, nil) == "" {
			t.Errorf("%s: min_clients %d without [federated] draws no warning", path, u.Config.MinClients)
		}
	}
}
