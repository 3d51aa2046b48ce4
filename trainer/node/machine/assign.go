package machine

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// Assignments lists, for every round the coordinator holds in s, which
// client trains which batch: what the p2p validator checks announcements
// against. Rounds are trained at step = start step + height; outside
// training (and cooldown, when the last rounds' results still arrive) there
// are none.
func Assignments(s *coordinator.Coordinator) []p2p.Assignment {
	if s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness && s.RunState != coordinator.Cooldown {
		return []p2p.Assignment{}
	}
	cur := s.CurrentRound()
	out := []p2p.Assignment{}
	for back := uint32(0); back <= min(cur.Height, coordinator.NumRounds-1); back++ {
		r := s.RoundAtHeight(cur.Height - back)
		if r == nil {
			continue
		}
		step := s.Epoch.StartStep + r.Height
		for i, d := range s.RoundAssignment(r) {
			if d.Count == 0 || i >= int(s.Epoch.ClientsLen) {
				continue
			}
			out = append(out, p2p.Assignment{Step: step, Batch: p2p.BatchRange{Start: d.Start, End: d.Start + d.Count}, Trainer: s.Epoch.Clients[i].ID})
		}
	}
	return out
}
