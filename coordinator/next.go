package coordinator

// NextRound is the training round that starts when the current one ends, as
// far as it is known now: its data index follows the current round's batch,
// its seed is NextRoundSeed, and its trainers are the clients that are
// healthy now, in epoch order (the round's start drops the others). Trainers
// use it to train that round while this one is witnessed; a client dropped
// before then, or the epoch ending instead, makes the guess wrong, so what is
// trained on it must be checked against the round that does start. ok is
// false outside RoundTrain and RoundWitness.
func (s *Coordinator) NextRound() (r Round, trainers []Pubkey, ok bool) {
	if s.RunState != RoundTrain && s.RunState != RoundWitness {
		return Round{}, nil, false
	}
	cur := s.CurrentRound()
	for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
		if c := &s.Epoch.Clients[i]; c.State == Healthy {
			trainers = append(trainers, c.ID.Signer)
		}
	}
	r = Round{DataIndex: cur.DataIndex + uint64(s.RoundBatchSize(cur)), RandomSeed: s.NextRoundSeed,
		Height: cur.Height + 1, ClientsLen: uint16(len(trainers))}
	return r, trainers, true
}

// DueAt is the earliest time (unix seconds) at which Tick changes the run
// by a timeout alone, or now when a condition already makes it change (a
// warmup below min_clients, every witness of the round in); ok is false when no tick can change it until an
// instruction does (halted, or waiting for members that are not there). A
// backend that ticks at DueAt, and again after each instruction, ticks no
// later than one that ticks on a fixed interval; the timeouts themselves are
// untouched.
func (s *Coordinator) DueAt(now uint64) (at uint64, ok bool) {
	timeout := func(d uint64) uint64 {
		// timedOut: now > start && now-start >= d.
		return max(s.RunStateStart+max(d, 1), now)
	}
	switch s.RunState {
	case WaitingForMembers:
		if s.PendingLen < s.Config.InitMinClients {
			return 0, false
		}
		return timeout(s.Config.WaitingForMembersExtraTime), true
	case Warmup:
		r := s.CurrentRound()
		if s.HealthyClients() < s.Config.MinClients || uint16(r.WitnessesLen) >= s.Config.WitnessCount(r.ClientsLen) {
			return now, true
		}
		return timeout(s.Config.WarmupTime), true
	case RoundTrain:
		if s.witnessesIn(s.CurrentRound()) {
			return now, true
		}
		return timeout(s.Config.MaxRoundTrainTime), true
	case RoundWitness:
		if s.witnessesIn(s.CurrentRound()) {
			return now, true
		}
		return timeout(s.Config.RoundWitnessTime), true
	case Cooldown:
		if s.Epoch.Checkpointed {
			return now, true
		}
		return timeout(s.Config.CooldownTime), true
	}
	return 0, false
}
