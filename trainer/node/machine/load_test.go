package machine

import (
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// warmupOf is a P2P run's warmup of epoch in which id is a client and the
// previous epoch's clients hold the model.
func warmupOf(id coordinator.ClientID, epoch uint32, warmup uint64) *coordinator.Coordinator {
	s := &coordinator.Coordinator{RunState: coordinator.Warmup}
	s.Config.WarmupTime = warmup
	s.Progress.Epoch = epoch
	s.Model.Checkpoint.Kind = coordinator.CheckpointP2P
	s.Epoch.Clients[0] = coordinator.Client{ID: id, State: coordinator.Healthy}
	s.Epoch.ClientsLen = 1
	return s
}

// The full-restart rule: a joiner gives up on its peers for the recorded
// checkpoint at once when nobody holds the model, and otherwise after its
// checkpoint wait, counted from its first failure in the epoch.
func TestPeersGivenUp(t *testing.T) {
	const t0 = 1_700_000_000
	id := coordinator.ClientID{Signer: coordinator.Pubkey{1}, P2P: coordinator.Pubkey{2}}
	for _, tc := range []struct {
		name   string
		warmup uint64 // the run's warmup time, seconds
		wait   uint64 // CheckpointWait
		why    LoadFailure
		tries  []uint64 // seconds after the first failure
		want   []bool
	}{
		{"nobody holds the model", 60, 0, LoadNoHolder, []uint64{0}, []bool{true}},
		{"unreachable holders: half the warmup", 60, 0, LoadNotYet, []uint64{0, 29, 30}, []bool{false, false, true}},
		{"a short warmup waits 5 s", 4, 0, LoadNotYet, []uint64{0, 4, 5}, []bool{false, false, true}},
		{"CheckpointWait", 60, 2, LoadNotYet, []uint64{0, 1, 2}, []bool{false, false, true}},
	} {
		m := New(id, 0, false, func() uint64 { return 1 })
		m.CheckpointWait(tc.wait)
		rd := m.Snapshot(warmupOf(id, 4, tc.warmup), t0)
		if rd.Load == nil || rd.Load.Source != LoadPeers {
			t.Fatalf("%s: the first load is %+v, want one from peers", tc.name, rd.Load)
		}
		for i, at := range tc.tries {
			rd := m.LoadFailed(4, LoadPeers, tc.why, t0+at)
			gaveUp := rd.Load != nil && rd.Load.Source == LoadRecorded
			if gaveUp != tc.want[i] || (!gaveUp && rd.Load != nil) {
				t.Errorf("%s: a failure at +%d s asks for %+v, want gave up = %v", tc.name, at, rd.Load, tc.want[i])
			}
		}
	}

	// A new epoch starts the wait again.
	m := New(id, 0, false, func() uint64 { return 1 })
	m.Snapshot(warmupOf(id, 1, 20), t0)
	m.LoadFailed(1, LoadPeers, LoadNotYet, t0)
	if rd := m.Snapshot(warmupOf(id, 2, 20), t0+60); rd.Load == nil || rd.Load.Source != LoadPeers {
		t.Fatalf("the next epoch's load is %+v, want one from peers", rd.Load)
	}
	if rd := m.LoadFailed(2, LoadPeers, LoadNotYet, t0+60); rd.Load != nil {
		t.Errorf("the wait carried over into the next epoch: %+v", rd.Load)
	}
	// A failure of an epoch the run has left changes nothing.
	if rd := m.LoadFailed(1, LoadPeers, LoadNoHolder, t0+61); rd.Load != nil {
		t.Errorf("a stale failure asked for %+v", rd.Load)
	}
}
