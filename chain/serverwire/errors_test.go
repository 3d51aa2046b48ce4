package serverwire

import (
	"errors"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// TestFailureAsError: a coordinator error comes back across the network as
// itself (errors.Is), its text once, and a detail the server added after
// it in parentheses (the CLI printed "coordinator is already initialized
// (coordinator: coordinator is already initialized)").
func TestFailureAsError(t *testing.T) {
	e := coordinator.ErrAlreadyInitialized
	for _, tc := range []struct {
		text, want string
	}{
		{e.Error(), e.Error()},
		{e.Error() + ": run r", e.Error() + " (run r)"},
	} {
		got := (&Failure{Code: e.Code, Name: e.Name, Error: tc.text}).Err()
		if !errors.Is(got, e) || got.Error() != tc.want {
			t.Errorf("%q: %q, want %q", tc.text, got, tc.want)
		}
	}
}
