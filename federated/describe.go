package federated

import (
	"fmt"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
)

// Describe is a deterministic multi-line description of a state (for logs
// and transcripts); name renders a client key (nil: its address).
func Describe(s *State, name func(coordinator.Pubkey) string) string {
	if name == nil {
		name = func(k coordinator.Pubkey) string { return k.String() }
	}
	var b strings.Builder
	c := &s.Config
	fmt.Fprintf(&b, "round %d, %d contributions, buffer %d/%d (max staleness %d), %s", s.Round, s.Contributions,
		len(s.Buffer), c.Capacity, c.MaxStaleness, c.Aggregation)
	if s.Finished() {
		b.WriteString(", finished")
	}
	if s.PrivacyFrom > 0 {
		fmt.Fprintf(&b, ", privacy settings since round %d", s.PrivacyFrom)
	}
	fmt.Fprintf(&b, "\nmodel %s\n", floats(s.Model))
	for _, u := range s.Buffer {
		fmt.Fprintf(&b, "  buffered %s base %d steps %d delta %s\n", name(u.Client), u.Base, u.Steps, floats(u.Delta))
	}
	return b.String()
}

// DescribeReady is a one-line description of a Ready.
func DescribeReady(r Ready, name func(coordinator.Pubkey) string) string {
	var parts []string
	if r.Persist {
		parts = append(parts, "persist")
	}
	for _, a := range r.Aggregated {
		names := make([]string, len(a.Clients))
		for i, c := range a.Clients {
			names[i] = name(c)
		}
		if a.Dropped {
			parts = append(parts, fmt.Sprintf("dropped the step from %s at round %d (it would make the model non-finite)", strings.Join(names, " "), a.Round))
			continue
		}
		parts = append(parts, fmt.Sprintf("aggregated round %d from %s (step norm %.4g)", a.Round, strings.Join(names, " "), a.Norm))
	}
	if len(parts) == 0 {
		return "ready: nothing"
	}
	return "ready: " + strings.Join(parts, "; ")
}

func floats(v []float32) string {
	const show = 8
	parts := make([]string, 0, min(len(v), show))
	for i, x := range v {
		if i == show {
			parts = append(parts, fmt.Sprintf("… (%d values)", len(v)))
			break
		}
		parts = append(parts, fmt.Sprintf("%.4g", x))
	}
	return "[" + strings.Join(parts, " ") + "]"
}
