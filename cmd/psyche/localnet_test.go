package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestLocalnetRunsTwoEpochs(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"psyche", "localnet", "--trainers", "4", "--epochs", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	got := out.String()
	for _, want := range []string{"Warmup", "RoundTrain", "RoundWitness", "Cooldown", "done: 2 epochs"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

func TestLocalnetRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--trainers", "0"}, {"--trainers", "300"}, {"--epochs", "0"}} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"psyche", "localnet"}, args...), &out, &errb); code == 0 {
			t.Errorf("%v: exit 0", args)
		} else if !strings.Contains(errb.String(), "must be") {
			t.Errorf("%v: unclear error %q", args, errb.String())
		}
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	t.Setenv("PSYCHE_TRAINERS", "2")
	t.Setenv("PSYCHE_NO_SUCH_FLAG", "1")
	var out, errb bytes.Buffer
	if code := run([]string{"psyche", "localnet", "--epochs", "1"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "2 trainers") {
		t.Errorf("PSYCHE_TRAINERS ignored:\n%s", out.String())
	}
	if !strings.Contains(errb.String(), "PSYCHE_NO_SUCH_FLAG") {
		t.Errorf("unknown variable not warned about: %q", errb.String())
	}
}
