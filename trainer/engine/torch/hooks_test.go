package torch

import (
	"context"
	"slices"
)

// What the tests read and set in a torch engine beyond the engine contract
// and Probe: the worker's ops behind these exist for them alone.

// Pids are the worker's processes: rank 0 (Pid) and, on several devices,
// every further rank in order.
func (e *eng) Pids() []int { return slices.Clone(e.w.pids) }

// Digests are each rank's digest of the parameters it holds (tests: every
// rank of a multi-device worker holds the same weights).
func (e *eng) Digests(ctx context.Context) ([]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, err := e.do(ctx, e.bulkTimeout(), bare(opDigests), nil)
	if err != nil {
		return nil, err
	}
	var f struct {
		Digests []string `json:"digests"`
	}
	return f.Digests, a.fields(&f)
}

// Gradients copies out the kept gradient, tensor by tensor in the model's
// order (parity tests and diagnostics; nothing in a round needs it).
func (e *eng) Gradients(ctx context.Context) ([][]float32, error) { return e.tensors(ctx, opGrads) }

// SetGradients replaces the kept gradient (parity tests feed both engines
// one gradient).
func (e *eng) SetGradients(ctx context.Context, grads [][]float32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err := e.do(ctx, e.bulkTimeout(), bare(opSetGrads), nil, sliceBlobs(grads))
	return err
}
