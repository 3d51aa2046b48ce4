package coordinator

import (
	"fmt"
	"strings"
)

// Describe formats the run compactly and deterministically on one line (for
// logs and transcripts).
func (s *Coordinator) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s@%d epoch=%d step=%d", s.RunState, s.RunStateStart, s.Progress.Epoch, s.Progress.Step)
	e := &s.Epoch
	switch s.RunState {
	case Warmup, RoundTrain, RoundWitness, Cooldown:
		r := s.CurrentRound()
		fmt.Fprintf(&b, " clients=%d/%d", s.HealthyClients(), e.ClientsLen)
		if s.RunState == Warmup {
			fmt.Fprintf(&b, " warmup-witnesses=%d/%d", r.WitnessesLen, s.Config.WitnessCount(r.ClientsLen))
		} else {
			fmt.Fprintf(&b, " round=h%d/slot%d data=%d+%d witnesses=%d/%d", r.Height, e.CurrentRound,
				r.DataIndex, s.RoundBatchSize(r), r.WitnessesLen, s.Config.WitnessCount(r.ClientsLen))
		}
		if e.LastStep != 0 {
			fmt.Fprintf(&b, " last-step=%d", e.LastStep)
		}
	}
	if s.PendingLen > 0 {
		fmt.Fprintf(&b, " pending=%d", s.PendingLen)
	}
	if e.ExitedLen > 0 {
		fmt.Fprintf(&b, " exited=%d", e.ExitedLen)
	}
	if s.PendingPause {
		b.WriteString(" pausing")
	}
	if e.ColdStart {
		b.WriteString(" cold-start")
	}
	if e.Checkpointed {
		b.WriteString(" checkpointed")
	}
	if s.Model.Checkpoint.Kind != CheckpointNone {
		fmt.Fprintf(&b, " ckpt=%s", s.Model.Checkpoint.Kind)
	}
	fmt.Fprintf(&b, " nonce=%d", s.Nonce)
	return b.String()
}

// DescribeClients lists the epoch members, the exited clients and the pending
// joiners, naming each key with name (for example a short hex prefix).
func (s *Coordinator) DescribeClients(name func(Pubkey) string) string {
	var b strings.Builder
	list := func(label string, cs []Client) {
		fmt.Fprintf(&b, "%s:", label)
		for _, c := range cs {
			fmt.Fprintf(&b, " %s", name(c.ID.Signer))
			if c.State != Healthy {
				fmt.Fprintf(&b, "(%s@h%d)", c.State, c.ExitedHeight)
			}
		}
		b.WriteString("\n")
	}
	list("clients", s.Epoch.Clients[:s.Epoch.ClientsLen])
	list("exited", s.Epoch.Exited[:s.Epoch.ExitedLen])
	b.WriteString("pending:")
	for _, id := range s.Pending[:s.PendingLen] {
		fmt.Fprintf(&b, " %s", name(id.Signer))
		if s.SitsOut(id.Signer) {
			b.WriteString("(sits-out)")
		}
	}
	b.WriteString("\n")
	return b.String()
}
