package torch

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/psyche-go/psyche/trainer/runmodel"
)

// sparePids are the prepared workers' processes.
func (op *Opener) sparePids() []int {
	op.mu.Lock()
	defer op.mu.Unlock()
	var out []int
	for _, sp := range op.spares {
		out = append(out, sp.w.pid())
	}
	return out
}

// TestPreparedWorkerIsOpened: a worker Prepare starts is the one the next
// Open with the same timeout takes (a trainer's load in a run's warmup then
// starts no process); one prepared for another timeout is not taken, and
// release stops a prepared worker no Open took (and nothing once one did).
func TestPreparedWorkerIsOpened(t *testing.T) {
	ctx := context.Background()
	_, op := openers(t)
	const timeout = 90 * time.Second
	release, err := op.Prepare(ctx, timeout)
	if err != nil {
		t.Fatal(err)
	}
	spares := op.sparePids()
	if len(spares) != 1 {
		t.Fatalf("Prepare left workers %v; want one", spares)
	}
	prepared := spares[0]
	pm := parityModels[0]
	m, err := runmodel.New(pm.cfg, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := op.Open(ctx, hostSpec(t, m, runOptions(true), timeout))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.(*eng).Pid(); got != prepared {
		t.Errorf("Open started worker %d; want the prepared %d", got, prepared)
	}
	if len(op.sparePids()) != 0 {
		t.Error("the opened worker is still a spare")
	}
	release() // taken: nothing to stop
	b := randomBatch(rand.New(rand.NewPCG(1, 1)), vocabOf(pm.cfg), 2, pm.cfg.Context())
	if _, err := e.Losses(ctx, b); err != nil {
		t.Fatalf("the opened engine after its preparation's release: %v", err)
	}
	e.Close()
	gone(t, prepared)

	// Prepared for another round time: Open starts its own, and release
	// stops the spare.
	release, err = op.Prepare(ctx, 2*timeout)
	if err != nil {
		t.Fatal(err)
	}
	other := op.sparePids()
	e, err = op.Open(ctx, hostSpec(t, m, runOptions(true), timeout))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(other, e.(*eng).Pid()) {
		t.Error("Open took a worker prepared for another timeout")
	}
	e.Close()
	release()
	if len(op.sparePids()) != 0 {
		t.Error("release kept the spare")
	}
	gone(t, other[0])
}
