package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/node"
)

// TestStatusLineKeepsLogsApart: a terminal that receives both the status and
// the log (stdout and stderr of one tty) shows each log line on a line of
// its own, with the status redrawn after it.
func TestStatusLineKeepsLogsApart(t *testing.T) {
	var tty bytes.Buffer // stdout and stderr interleave on one terminal
	s := &statusLine{term: &tty}
	log := slog.New(slog.NewTextHandler(s.LogWriter(&tty), &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	log.Warn("before any status") // nothing to clear yet
	s.Set("epoch 0 step 1")
	log.Warn("instruction refused")
	s.Set("epoch 0 step 2")
	s.Done()
	want := "level=WARN msg=\"before any status\"\n" +
		clearLine + "epoch 0 step 1" +
		clearLine + "level=WARN msg=\"instruction refused\"\n" + "epoch 0 step 1" +
		clearLine + "epoch 0 step 2" + "\n"
	if got := tty.String(); got != want {
		t.Fatalf("terminal bytes\n got %q\nwant %q", got, want)
	}
	// What a person sees: every log line whole, the status last.
	screen := render(tty.String())
	if screen[len(screen)-1] != "epoch 0 step 2" || !strings.HasPrefix(screen[1], "level=WARN msg=\"instruction refused\"") {
		t.Fatalf("screen %q", screen)
	}
}

// render plays carriage returns and line erasures the way a terminal does.
func render(b string) []string {
	lines := []string{""}
	for len(b) > 0 {
		switch {
		case strings.HasPrefix(b, clearLine):
			lines[len(lines)-1] = ""
			b = b[len(clearLine):]
		case b[0] == '\n':
			lines = append(lines, "")
			b = b[1:]
		default:
			lines[len(lines)-1] += b[:1]
			b = b[1:]
		}
	}
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

func TestJoinStatusShowsNoLossBeforeTraining(t *testing.T) {
	before := joinStatus(node.Progress{State: coordinator.Warmup, Epoch: 0, Step: 1}, 2)
	if !strings.Contains(before, "loss -") || strings.Contains(before, "0.000") {
		t.Errorf("before any batch: %q", before)
	}
	after := joinStatus(node.Progress{State: coordinator.RoundTrain, Step: 3, Loss: 4.25, Tokens: 512}, 2)
	if !strings.Contains(after, "loss 4.250") || !strings.Contains(after, "tokens 512") {
		t.Errorf("after training: %q", after)
	}
}
