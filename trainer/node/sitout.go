package node

import (
	"fmt"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// sitOut is what the node knows of an epoch the coordinator leaves it out
// of: a trainer that a health check dropped sits the next epoch out when
// the run has min_clients without it (coordinator.SitsOut). Said nowhere,
// a restarted trainer sat an epoch out in silence and could end with "this
// trainer trained 0 tokens".
type sitOut struct {
	pendingFor uint32  // 1 + the epoch this node last waited to join (0: none)
	droppedAt  *uint32 // the round a health check dropped it at, in the epoch before
	said       uint32  // 1 + the epoch it said it sits out
}

// reportSitOut notes, while this node waits to join an epoch, where it was
// dropped, and when that epoch starts without it, logs once why and until
// when.
func (n *Node) reportSitOut(s *coordinator.Coordinator) {
	me := n.id.Signer
	o := &n.sitOut
	switch s.RunState {
	case coordinator.WaitingForMembers:
		if _, ok := s.PendingIndex(me); ok {
			o.pendingFor, o.droppedAt = s.Progress.Epoch+1, droppedAt(s, me)
		}
	case coordinator.Warmup, coordinator.RoundTrain, coordinator.RoundWitness, coordinator.Cooldown:
		epoch := s.Progress.Epoch
		if o.pendingFor != epoch+1 || o.said == epoch+1 {
			return
		}
		if _, member := s.ClientIndex(me); member {
			return
		}
		o.said = epoch + 1
		why := "a health check dropped this trainer in the epoch before"
		if o.droppedAt != nil {
			why = fmt.Sprintf("a health check dropped this trainer at round %d of the epoch before", *o.droppedAt)
		}
		// The epoch's rounds end epoch_time after its start (and two
		// rounds), then its cooldown: the node joins the next one then.
		until := time.Unix(int64(s.Epoch.StartTimestamp+s.Config.EpochTime+s.Config.CooldownTime), 0).UTC()
		n.cfg.log.Warn(fmt.Sprintf("sitting epoch %d out: %s, and the run has min_clients without it; this trainer joins epoch %d when this one ends, about %s",
			epoch, why, epoch+1, until.Format(time.RFC3339)), "epoch", epoch)
	}
}

// droppedAt is the round at which a health check dropped signer in the
// epoch that ended (or is in progress), nil if it did not.
func droppedAt(s *coordinator.Coordinator, signer coordinator.Pubkey) *uint32 {
	e := &s.Epoch
	for _, c := range append(e.Clients[:e.ClientsLen:e.ClientsLen], e.Exited[:e.ExitedLen]...) {
		if c.State == coordinator.Dropped && c.ID.Signer == signer {
			h := c.ExitedHeight
			return &h
		}
	}
	return nil
}
