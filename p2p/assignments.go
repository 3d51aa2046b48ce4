package p2p

import (
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
)

// Assignments indexes a round's assignments for the validator: who trains
// batch at step.
type Assignments map[assignmentKey]coordinator.ClientID

type assignmentKey struct {
	step  uint32
	batch BatchRange
}

// IndexAssignments indexes as.
func IndexAssignments(as []Assignment) Assignments {
	m := make(Assignments, len(as))
	for _, a := range as {
		m[assignmentKey{a.Step, a.Batch}] = a.Trainer
	}
	return m
}

// Assigns reports whether the index assigns any batch at step: a view
// that does not has not reached that round yet.
func (m Assignments) Assigns(step uint32) bool {
	for k := range m {
		if k.step == step {
			return true
		}
	}
	return false
}

// Check reports whether trainer is assigned batch at step (wrapping
// ErrNotAssigned when not). A nil index checks nothing: SetAssignments has
// not been called.
func (m Assignments) Check(step uint32, batch BatchRange, trainer coordinator.ClientID) error {
	if m == nil {
		return nil
	}
	switch who, ok := m[assignmentKey{step, batch}]; {
	case !ok:
		return fmt.Errorf("%w: no batch [%d,%d) at step %d", ErrNotAssigned, batch.Start, batch.End, step)
	case who != trainer:
		return fmt.Errorf("%w: batch [%d,%d) at step %d belongs to another trainer", ErrNotAssigned, batch.Start, batch.End, step)
	}
	return nil
}
