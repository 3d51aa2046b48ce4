package coordinator

import (
	"crypto/sha256"
	"encoding/binary"
)

// Salts separate the independent shuffles drawn from one round seed.
const (
	SaltCommittee  = "committee"
	SaltWitness    = "witness"
	SaltCheckpoint = "checkpoint"
	// SaltFirstRound derives an epoch's first training round's seed from the
	// seed drawn when its warmup starts (see FirstRoundSeed).
	SaltFirstRound = "first-round"
)

// FirstRoundSeed is the seed of an epoch's first training round, drawn with
// its warmup's: le64(ShuffleKey(seed, SaltFirstRound)[0:8]). Each later
// round's seed is drawn when the round before it starts.
func FirstRoundSeed(warmupSeed uint64) uint64 {
	k := ShuffleKey(warmupSeed, SaltFirstRound)
	return binary.LittleEndian.Uint64(k[:8])
}

// ShuffleKey derives the key of one shuffle: sha256(sha256(le64(seed)) ‖ salt).
func ShuffleKey(seed uint64, salt string) Hash {
	var le [8]byte
	binary.LittleEndian.PutUint64(le[:], seed)
	seed32 := sha256.Sum256(le[:])
	var buf [32 + 16]byte
	copy(buf[:], seed32[:])
	n := copy(buf[32:], salt)
	return sha256.Sum256(buf[:32+n])
}

// SwapOrNot maps index (< n) to its position in a pseudo-random permutation of
// [0, n) keyed by key, with 90 rounds of the swap-or-not construction. Each
// index is computed on its own in O(rounds) hashes, so a proof of one client's
// position is checked without shuffling the whole list.
//
// Round r: pivot = le64(sha256(key ‖ r)[0:8]) mod n; flip = (pivot + n − i)
// mod n; p = max(i, flip); the bit p mod 256 of sha256(key ‖ r ‖ le32(p/256))
// decides whether i becomes flip. r is one byte.
func SwapOrNot(index, n uint64, key Hash) uint64 {
	if n <= 1 || index >= n {
		return index
	}
	var buf [32 + 1 + 4]byte
	copy(buf[:], key[:])
	for r := 0; r < shuffleRounds; r++ {
		buf[32] = byte(r)
		ph := sha256.Sum256(buf[:33])
		pivot := binary.LittleEndian.Uint64(ph[:8]) % n
		flip := (pivot + n - index) % n
		p := max(index, flip)
		binary.LittleEndian.PutUint32(buf[33:], uint32(p/256))
		src := sha256.Sum256(buf[:37])
		bit := (src[(p%256)/8] >> (p % 8)) & 1
		if bit == 1 {
			index = flip
		}
	}
	return index
}

// Committee is a client's role in a round.
type Committee uint8

const (
	TrainerCommittee Committee = iota
	VerifierCommittee
	TieBreakerCommittee
)

func (c Committee) String() string {
	switch c {
	case TrainerCommittee:
		return "Trainer"
	case VerifierCommittee:
		return "Verifier"
	case TieBreakerCommittee:
		return "TieBreaker"
	}
	return "Committee(?)"
}

// CommitteeOf returns the committee of a committee position: every client
// trains. verification_percent does not make verifier committees here: the
// round's witnesses score a sample of the trainers' results instead, and
// the health check drops those that fail it (trainer/node).
func (k *Config) CommitteeOf(position uint64) (Committee, error) {
	return TrainerCommittee, nil
}

// WitnessCount is the number of witness slots of a round: witness_nodes, or
// min(clients, 32) when it is 0, and never more than the round's clients.
func (k *Config) WitnessCount(clientsLen uint16) uint16 {
	w := k.WitnessNodes
	if w == 0 {
		w = MaxWitnesses
	}
	return min(w, clientsLen, MaxWitnesses)
}

// Quorum is the number of agreeing witnesses out of w needed to accept
// something: 1→1, 2→2, 3→2, otherwise max(1, ⌊2w/3⌋).
func Quorum(w uint16) uint16 {
	switch w {
	case 0, 1:
		return 1
	case 2, 3:
		return 2
	}
	return max(1, 2*w/3)
}

// WitnessPosition is the witness-shuffle position of a client index in a round.
func (r *Round) WitnessPosition(index uint16) uint16 {
	return uint16(SwapOrNot(uint64(index), uint64(r.ClientsLen), ShuffleKey(r.RandomSeed, SaltWitness)))
}

// CommitteePosition is the committee-shuffle position of a client index in a round.
func (r *Round) CommitteePosition(index uint16) uint16 {
	return uint16(SwapOrNot(uint64(index), uint64(r.ClientsLen), ShuffleKey(r.RandomSeed, SaltCommittee)))
}

// WitnessProofFor builds the proof a client with the given index presents as
// a witness of round r.
func (k *Config) WitnessProofFor(r *Round, index uint16) WitnessProof {
	pos := r.WitnessPosition(index)
	return WitnessProof{Position: pos, Index: index, IsWitness: pos < k.WitnessCount(r.ClientsLen)}
}

// HealthCheckProofFor builds the proof naming a client in a health check: its
// committee position in the current round and whether it is a witness.
func (k *Config) HealthCheckProofFor(r *Round, index uint16) WitnessProof {
	return WitnessProof{Position: r.CommitteePosition(index), Index: index,
		IsWitness: r.WitnessPosition(index) < k.WitnessCount(r.ClientsLen)}
}

// CheckpointerCount is ⌈n/3⌉: how many of an epoch's n clients may record a checkpoint.
func CheckpointerCount(n uint16) uint16 { return (n + 2) / 3 }

// IsCheckpointer reports whether the client at index of the current list is
// elected to record this epoch's checkpoint (drawn from the last round's seed).
func (s *Coordinator) IsCheckpointer(index uint16) bool {
	n := s.Epoch.ClientsLen
	if index >= n {
		return false
	}
	r := s.CurrentRound()
	pos := SwapOrNot(uint64(index), uint64(n), ShuffleKey(r.RandomSeed, SaltCheckpoint))
	return pos < uint64(CheckpointerCount(n))
}

// HealthScore counts the witnesses of round r whose participant bloom holds
// the client with the given signer.
func HealthScore(r *Round, signer Pubkey) uint16 {
	member := ParticipantMember(signer)
	var score uint16
	for i := 0; i < int(r.WitnessesLen); i++ {
		w := &r.Witnesses[i]
		if w.Participants.Has(w.Key, member) {
			score++
		}
	}
	return score
}

// ConsensusCommitment picks the accepted result for one batch of round r.
// Candidates are the commitment hashes seen for the batch; each witness votes
// for the first candidate (in byte order, so that every client counts the same
// way) that its broadcast bloom holds, and the winner needs a quorum.
func (k *Config) ConsensusCommitment(r *Round, candidates []Hash) (Hash, bool) {
	sorted := append([]Hash(nil), candidates...)
	for i := 1; i < len(sorted); i++ { // insertion sort: there are one or two candidates
		for j := i; j > 0 && lessHash(sorted[j], sorted[j-1]); j-- {
			sorted[j], sorted[j-1] = sorted[j-1], sorted[j]
		}
	}
	votes := make([]uint16, len(sorted))
	for wi := 0; wi < int(r.WitnessesLen); wi++ {
		w := &r.Witnesses[wi]
		for ci, c := range sorted {
			if w.Broadcasts.Has(w.Key, c) {
				votes[ci]++
				break
			}
		}
	}
	q := Quorum(k.WitnessCount(r.ClientsLen))
	for ci, v := range votes {
		if v >= q {
			return sorted[ci], true
		}
	}
	return Hash{}, false
}

func lessHash(a, b Hash) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}
