package node

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// TestEpochLine: a trainer's rounds log one INFO line an epoch, when they
// end, with the epoch's steps and what the trainer did in them; its steps
// are DEBUG (three INFO lines a step before).
func TestEpochLine(t *testing.T) {
	var log bytes.Buffer
	n := &Node{cfg: config{log: slog.New(slog.NewTextHandler(&log, nil))}}
	seen := []Progress{
		{State: coordinator.Warmup, Epoch: 1, Step: 10},
		{State: coordinator.RoundTrain, Epoch: 1, Step: 10, Tokens: 1000, Sent: 50},
	}
	for step := uint32(11); step <= 30; step++ {
		seen = append(seen, Progress{State: coordinator.RoundWitness, Epoch: 1, Step: step, Tokens: uint64(step) * 100, Applied: uint64(step - 10), Sent: 50 + uint64(step)},
			Progress{State: coordinator.RoundTrain, Epoch: 1, Step: step, Tokens: uint64(step) * 100, Applied: uint64(step - 10), Sent: 50 + uint64(step)})
	}
	seen = append(seen, Progress{State: coordinator.Cooldown, Epoch: 1, Step: 30, Loss: 2.5, Tokens: 3000, Applied: 20, Sent: 80},
		Progress{State: coordinator.WaitingForMembers, Epoch: 2, Step: 30})
	for _, p := range seen {
		n.logEpoch(p)
	}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines for an epoch of 20 steps, want 1:\n%s", len(lines), log.String())
	}
	for _, want := range []string{"level=INFO", `msg="epoch trained"`, "epoch=1", "steps=10-30", "loss=2.5", "tokens=2000", "rounds_applied=20", "sent_bytes=30", "now=Cooldown"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("the epoch's line lacks %s: %s", want, lines[0])
		}
	}
}
