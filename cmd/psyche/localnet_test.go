package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestLocalnetTrains runs the README's main command for one short epoch: a
// server, three trainers over libp2p on 127.0.0.1, real training.
func TestLocalnetTrains(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	var out, errb bytes.Buffer
	// Debug logs go to errb, shown only if the run goes wrong.
	code := run([]string{"psyche", "--log-level", "debug", "localnet", "--trainers", "3", "--epochs", "1", "--epoch-time", "6", "--dir", t.TempDir()}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errb.String(), out.String())
	}
	got := out.String()
	t.Log("\n" + got)
	for _, want := range []string{"localnet: run", "epoch 0  step", "held-out loss:", "trainers hold identical weights: true", "checkpoint: "} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if t.Failed() {
		lines := strings.Split(errb.String(), "\n")
		t.Log("the last log lines:\n" + strings.Join(lines[max(0, len(lines)-150):], "\n"))
	}
}

func TestLocalnetRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--trainers", "0"}, {"--trainers", "300"}, {"--epochs", "0"}, {"--epoch-time", "2"}} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"psyche", "localnet"}, args...), &out, &errb); code == 0 {
			t.Errorf("%v: exit 0", args)
		} else if !strings.Contains(errb.String(), "must be") {
			t.Errorf("%v: unclear error %q", args, errb.String())
		}
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	t.Setenv("PSYCHE_TRAINERS", "0")
	t.Setenv("PSYCHE_NO_SUCH_FLAG", "1")
	var out, errb bytes.Buffer
	if code := run([]string{"psyche", "localnet"}, &out, &errb); code == 0 {
		t.Fatal("PSYCHE_TRAINERS=0 accepted")
	}
	if !strings.Contains(errb.String(), "--trainers must be between 1 and 16, got 0") {
		t.Errorf("PSYCHE_TRAINERS ignored: %q", errb.String())
	}
	if !strings.Contains(errb.String(), "PSYCHE_NO_SUCH_FLAG") {
		t.Errorf("unknown variable not warned about: %q", errb.String())
	}
}
