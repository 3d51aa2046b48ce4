package coordinator

// lcg is the 64-bit linear congruential generator (Knuth's MMIX constants)
// that shuffles trainers for data assignment. It only has to be cheap and the
// same everywhere, not unpredictable: its seed is the round seed.
type lcg struct{ state uint64 }

func (g *lcg) next() uint64 {
	g.state = g.state*6364136223846793005 + 1442695040888963407
	return g.state
}

func (g *lcg) nextRange(m uint64) uint64 { return g.next() % m }

// DataRange is a run of consecutive data indices [Start, Start+Count); one
// data index is one sequence of max_seq_len+1 tokens.
type DataRange struct {
	Start uint64
	Count uint64
}

// AssignData splits the batch [dataIndex, dataIndex+batchSize) among n
// trainers. The trainers, in epoch order, are Fisher–Yates shuffled with the
// LCG seeded by seed; the i-th shuffled trainer gets ⌊B/n⌋ indices, plus one if
// i < B mod n, following the previous one. The result is indexed by trainer.
func AssignData(seed, dataIndex uint64, batchSize uint16, n int) []DataRange {
	if n <= 0 {
		return nil
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	g := lcg{state: seed}
	for i := n - 1; i >= 1; i-- {
		j := int(g.nextRange(uint64(i + 1)))
		order[i], order[j] = order[j], order[i]
	}
	out := make([]DataRange, n)
	b := uint64(batchSize)
	per, extra := b/uint64(n), b%uint64(n)
	next := dataIndex
	for i, trainer := range order {
		count := per
		if uint64(i) < extra {
			count++
		}
		out[trainer] = DataRange{Start: next, Count: count}
		next += count
	}
	return out
}

// RoundBatchSize is the batch size of round r.
func (s *Coordinator) RoundBatchSize(r *Round) uint16 {
	return s.Config.BatchSize(s.Model.MaxSeqLen, r.DataIndex)
}

// RoundAssignment is the data of every trainer of round r, by epoch index.
func (s *Coordinator) RoundAssignment(r *Round) []DataRange {
	return AssignData(r.RandomSeed, r.DataIndex, s.RoundBatchSize(r), int(r.ClientsLen))
}

// CurrentRound is the round in the current ring slot.
func (s *Coordinator) CurrentRound() *Round { return &s.Epoch.Rounds[s.Epoch.CurrentRound] }

// PreviousRound is the round before the current one in this epoch, or nil in
// the epoch's first round.
func (s *Coordinator) PreviousRound() *Round {
	if s.Epoch.FirstRound {
		return nil
	}
	r := s.CurrentRound()
	if r.Height == 0 {
		return nil
	}
	return &s.Epoch.Rounds[(s.Epoch.CurrentRound+NumRounds-1)%NumRounds]
}

// RoundAtHeight returns the round of this epoch with the given height if the
// ring still holds it.
func (s *Coordinator) RoundAtHeight(height uint32) *Round {
	cur := s.CurrentRound()
	if height > cur.Height || cur.Height-height >= NumRounds {
		return nil
	}
	back := uint8(cur.Height - height)
	return &s.Epoch.Rounds[(s.Epoch.CurrentRound+NumRounds-back)%NumRounds]
}

// ClientIndex finds an epoch member by signer.
func (s *Coordinator) ClientIndex(signer Pubkey) (uint16, bool) {
	for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
		if s.Epoch.Clients[i].ID.Signer == signer {
			return i, true
		}
	}
	return 0, false
}

// PendingIndex finds a pending joiner by signer.
func (s *Coordinator) PendingIndex(signer Pubkey) (uint16, bool) {
	for i := uint16(0); i < s.PendingLen; i++ {
		if s.Pending[i].Signer == signer {
			return i, true
		}
	}
	return 0, false
}

// SittingOut reports whether a health check dropped signer in the current
// epoch (or, between epochs, in the one that just ended): such a client
// sits out the next epoch. It may join, but the next epoch's warmup leaves
// it out (unless the run needs it to reach min_clients), and it may join
// the epoch after. The run cannot tell a trainer that withholds its results
// from one that crashed, and each admitted silent trainer costs every other
// trainer a round's patience (docs/security.md, "Silent trainers"); sitting
// out costs the dropped one only its own epoch.
func (s *Coordinator) SittingOut(signer Pubkey) bool {
	e := &s.Epoch
	for i := uint16(0); i < e.ClientsLen; i++ {
		if c := &e.Clients[i]; c.State == Dropped && c.ID.Signer == signer {
			return true
		}
	}
	for i := uint16(0); i < e.ExitedLen; i++ {
		if c := &e.Exited[i]; c.State == Dropped && c.ID.Signer == signer {
			return true
		}
	}
	return false
}

// HealthyClients counts the epoch members that are still healthy.
func (s *Coordinator) HealthyClients() uint16 {
	var n uint16
	for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
		if s.Epoch.Clients[i].State == Healthy {
			n++
		}
	}
	return n
}

// CheckpointHolders lists the epoch's clients that ended the previous epoch
// as clients too (the epoch's start moved those to the exited list): the
// peers that hold the model this epoch starts from, when the checkpoint is
// P2P. Clients that exit during the epoch leave the list.
func (s *Coordinator) CheckpointHolders() []ClientID {
	var out []ClientID
	e := &s.Epoch
	for i := uint16(0); i < e.ClientsLen; i++ {
		c := e.Clients[i]
		if c.State != Healthy {
			continue
		}
		for _, x := range e.Exited[:e.ExitedLen] {
			if x.ID == c.ID {
				out = append(out, c.ID)
				break
			}
		}
	}
	return out
}
