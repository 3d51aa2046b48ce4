package node

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// TestSitOutIsSaid: a trainer that a health check dropped, back for the
// next epoch, which the run starts without it (it has min_clients
// without it), says once in its log that it sits the epoch out, why, and
// until when; one the run admits says nothing.
func TestSitOutIsSaid(t *testing.T) {
	me, alice, bob := coordinator.Pubkey{1}, coordinator.Pubkey{2}, coordinator.Pubkey{3}
	id := func(k coordinator.Pubkey) coordinator.ClientID {
		return coordinator.ClientID{Signer: k, P2P: coordinator.Pubkey{9, k[0]}}
	}
	// waiting: epoch 4 waits for members, after an epoch in which me was
	// dropped at round 1; alice, bob and me have joined.
	waiting := func(minClients uint16) *coordinator.Coordinator {
		s := &coordinator.Coordinator{RunState: coordinator.WaitingForMembers}
		s.Progress.Epoch = 4
		s.Config.MinClients, s.Config.InitMinClients, s.Config.EpochTime, s.Config.CooldownTime = minClients, 3, 30, 10
		s.Epoch.ClientsLen = uint16(copy(s.Epoch.Clients[:], []coordinator.Client{{ID: id(alice)}, {ID: id(bob)}}))
		s.Epoch.ExitedLen = uint16(copy(s.Epoch.Exited[:], []coordinator.Client{{ID: id(me), State: coordinator.Dropped, ExitedHeight: 1}}))
		s.PendingLen = uint16(copy(s.Pending[:], []coordinator.ClientID{id(alice), id(bob), id(me)}))
		return s
	}
	// started: the epoch under way, with members (the warmup's choice).
	started := func(st coordinator.RunState, members ...coordinator.Pubkey) *coordinator.Coordinator {
		s := &coordinator.Coordinator{RunState: st}
		s.Progress.Epoch = 4
		s.Config.EpochTime, s.Config.CooldownTime = 30, 10
		s.Epoch.StartTimestamp = 1_800_000_000
		for _, k := range members {
			s.Epoch.Clients[s.Epoch.ClientsLen] = coordinator.Client{ID: id(k)}
			s.Epoch.ClientsLen++
		}
		return s
	}
	for _, tc := range []struct {
		name  string
		snaps []*coordinator.Coordinator
		want  string // the one warning; "" for none
	}{
		{"left out", []*coordinator.Coordinator{waiting(2), started(coordinator.Warmup, alice, bob), started(coordinator.RoundTrain, alice, bob),
			started(coordinator.Cooldown, alice, bob)},
			"sitting epoch 4 out: a health check dropped this trainer at round 1 of the epoch before, and the run has min_clients without it; " +
				"this trainer joins epoch 5 when this one ends, about 2027-01-15T08:00:40Z"},
		{"needed", []*coordinator.Coordinator{waiting(3), started(coordinator.Warmup, alice, bob, me), started(coordinator.RoundTrain, alice, bob, me)}, ""},
		{"never joined", []*coordinator.Coordinator{started(coordinator.Warmup, alice, bob), started(coordinator.RoundTrain, alice, bob)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			n := &Node{id: id(me), cfg: config{log: slog.New(slog.NewTextHandler(&log, nil))}}
			for _, s := range tc.snaps {
				n.reportSitOut(s)
			}
			lines := strings.Count(log.String(), "\n")
			switch {
			case tc.want == "" && lines != 0:
				t.Errorf("logged:\n%s", log.String())
			case tc.want != "" && (lines != 1 || !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), tc.want)):
				t.Errorf("logged:\n%s\nwant one warning saying %q", log.String(), tc.want)
			}
		})
	}
}
