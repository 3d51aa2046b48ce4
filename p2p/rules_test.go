package p2p

import (
	"errors"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

func TestMajorityOffer(t *testing.T) {
	x, y := coordinator.Hash{1}, coordinator.Hash{2}
	for _, tt := range []struct {
		name  string
		votes map[coordinator.Hash]int
		want  coordinator.Hash
		err   error
	}{
		{"none", nil, coordinator.Hash{}, ErrNoCheckpoint},
		{"one", map[coordinator.Hash]int{x: 1}, x, nil},
		{"most", map[coordinator.Hash]int{x: 1, y: 2}, y, nil},
		{"tie", map[coordinator.Hash]int{x: 2, y: 2}, coordinator.Hash{}, ErrCheckpointDisputed},
	} {
		got, err := MajorityOffer(tt.votes)
		if got != tt.want || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
			t.Errorf("%s: %x, %v; want %x, %v", tt.name, got[:1], err, tt.want[:1], tt.err)
		}
	}
}

func TestAssignmentsCheck(t *testing.T) {
	a, b := coordinator.ClientID{Signer: coordinator.Pubkey{1}}, coordinator.ClientID{Signer: coordinator.Pubkey{2}}
	m := IndexAssignments([]Assignment{{Step: 3, Batch: BatchRange{Start: 0, End: 4}, Trainer: a}})
	for _, tt := range []struct {
		name    string
		step    uint32
		batch   BatchRange
		trainer coordinator.ClientID
		ok      bool
	}{
		{"assigned", 3, BatchRange{Start: 0, End: 4}, a, true},
		{"another trainer", 3, BatchRange{Start: 0, End: 4}, b, false},
		{"another step", 4, BatchRange{Start: 0, End: 4}, a, false},
		{"a sub-range", 3, BatchRange{Start: 0, End: 2}, a, false},
	} {
		err := m.Check(tt.step, tt.batch, tt.trainer)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrNotAssigned)) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	if err := Assignments(nil).Check(9, BatchRange{}, b); err != nil {
		t.Errorf("no index yet: %v", err)
	}
}
