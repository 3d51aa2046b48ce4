package p2p

import (
	"errors"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

func TestMajorityOffer(t *testing.T) {
	x, y := coordinator.Hash{1}, coordinator.Hash{2}
	for _, tt := range []struct {
		name     string
		votes    map[coordinator.Hash]int
		answered int
		want     coordinator.Hash
		err      error
	}{
		{"none", nil, 3, coordinator.Hash{}, ErrNoCheckpoint},
		{"the only peer", map[coordinator.Hash]int{x: 1}, 1, x, nil},
		{"a plurality of one among three", map[coordinator.Hash]int{x: 1}, 3, coordinator.Hash{}, ErrCheckpointDisputed},
		{"a majority", map[coordinator.Hash]int{x: 1, y: 2}, 3, y, nil},
		{"most, but not a majority", map[coordinator.Hash]int{x: 1, y: 2}, 4, coordinator.Hash{}, ErrCheckpointDisputed},
		{"tie", map[coordinator.Hash]int{x: 2, y: 2}, 4, coordinator.Hash{}, ErrCheckpointDisputed},
		{"answered below the votes counts the votes", map[coordinator.Hash]int{x: 2, y: 1}, 0, x, nil},
	} {
		got, err := MajorityOffer(tt.votes, tt.answered)
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
