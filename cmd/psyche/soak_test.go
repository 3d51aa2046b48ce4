package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHonestTrainersKeepTheirPlace is the short form of scripts/soak-localnet:
// localnets on the real clock (no virtual time: a worker's start, a load or a
// stalled process meets the run's timeouts as on real machines) of PyTorch
// trainers over two CPU ranks each, and of a mixed run. Every trainer is
// honest, so none may be dropped by a health check, and trainers of one
// engine end with one model. Before witnesses counted their patience in
// watched seconds and trainers started their workers before joining, about
// half of such runs dropped a trainer in the first rounds.
func TestHonestTrainersKeepTheirPlace(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end runs")
	}
	if raceEnabled {
		// Instrumented, a trainer's loop is slow enough that rounds meet
		// their training limit: what that drops is not what this test is
		// about. scripts/test runs it without -race.
		t.Skip("real-time localnets: run without -race")
	}
	for _, engines := range [][]string{{"--engine", "torch", "--devices", "cpu,cpu"}, {"--engine", "go,torch,torch"}} {
		args := append([]string{"psyche", "--log-level", "debug", "localnet", "--trainers", "3", "--epochs", "2",
			"--explorer-addr", "", "--dir", t.TempDir()}, engines...)
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		got := out.String()
		if code != 0 {
			t.Fatalf("%s: exit %d: %s\n%s", strings.Join(engines, " "), code, tail(errb.String(), 150), got)
		}
		for _, bad := range []string{"was dropped by a health check", "identical weights: false"} {
			if strings.Contains(got, bad) {
				t.Errorf("%s: %q:\n%s\n%s", strings.Join(engines, " "), bad, got, tail(errb.String(), 200))
			}
		}
		if !strings.Contains(got, "identical weights: true") {
			t.Errorf("%s: no summary of the trainers' weights:\n%s", strings.Join(engines, " "), got)
		}
	}
}
