package secagg

import (
	"crypto/ecdh"
	"fmt"
	"slices"
)

// Phase is where a round stands on the server.
type Phase int

const (
	PhaseAdvertise Phase = iota
	PhaseShare
	PhaseMask
	PhaseUnmask
	PhaseDone
)

// Server is the server's side of a round: a pure machine that checks and
// relays messages; its driver closes each phase (when every client of the
// phase before has answered, or at a deadline), and a phase closes only
// with at least the threshold of answers.
type Server struct {
	threshold int
	degree    int // the masking graph's (Neighbors)
	n         int // values per input
	nb        map[ID]map[ID]bool
	phase     Phase
	keys      map[ID]Keys
	shares    map[ID][]Ciphertext
	masked    map[ID][]uint32
	reveals   map[ID]*Reveal
	survivors []ID
}

// NewServer starts a round of inputs of n values with threshold t and
// masking graph degree k (Neighbors; 0: every other client).
func NewServer(t, k, n int) (*Server, error) {
	if t < 2 || t > MaxClients || n < 1 || k < 0 || (k > 0 && k+1 < t) {
		return nil, fmt.Errorf("%w: threshold %d, degree %d, %d values", ErrMismatch, t, k, n)
	}
	return &Server{threshold: t, degree: k, n: n, keys: map[ID]Keys{}, shares: map[ID][]Ciphertext{}, masked: map[ID][]uint32{},
		reveals: map[ID]*Reveal{}}, nil
}

// Phase is the current phase.
func (s *Server) Phase() Phase { return s.phase }

// Advertise takes a client's keys.
func (s *Server) Advertise(k Keys) error {
	if s.phase != PhaseAdvertise {
		return ErrPhase
	}
	if k.ID == 0 {
		return fmt.Errorf("%w: client id 0", ErrMismatch)
	}
	if _, dup := s.keys[k.ID]; dup {
		return fmt.Errorf("%w: client %d advertised twice", ErrMismatch, k.ID)
	}
	s.keys[k.ID] = k
	return nil
}

func sortedIDs[V any](m map[ID]V) []ID {
	ids := make([]ID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// CloseAdvertise ends step 1: the keys every client is sent.
func (s *Server) CloseAdvertise() ([]Keys, error) {
	if s.phase != PhaseAdvertise {
		return nil, ErrPhase
	}
	if len(s.keys) < s.threshold {
		return nil, fmt.Errorf("%w: %d advertised", ErrTooFew, len(s.keys))
	}
	s.phase = PhaseShare
	var out []Keys
	ids := sortedIDs(s.keys)
	s.nb = map[ID]map[ID]bool{}
	for _, id := range ids {
		out = append(out, s.keys[id])
		s.nb[id] = map[ID]bool{}
		for _, v := range Neighbors(ids, s.degree, id) {
			s.nb[id][v] = true
		}
	}
	return out, nil
}

// Shares takes a client's encrypted shares: one for each of its
// neighbors.
func (s *Server) Shares(from ID, cts []Ciphertext) error {
	if s.phase != PhaseShare {
		return ErrPhase
	}
	if _, ok := s.keys[from]; !ok {
		return fmt.Errorf("%w: %d did not advertise", ErrUnknown, from)
	}
	if _, dup := s.shares[from]; dup {
		return fmt.Errorf("%w: %d sent shares twice", ErrMismatch, from)
	}
	seen := map[ID]bool{}
	for _, ct := range cts {
		if ct.From != from || ct.To == from || seen[ct.To] || len(ct.Box) != sharePairSize+16 {
			return fmt.Errorf("%w: a share from %d to %d", ErrMismatch, ct.From, ct.To)
		}
		if !s.nb[from][ct.To] {
			return fmt.Errorf("%w: a share for %d, who is not a neighbor of %d", ErrUnknown, ct.To, from)
		}
		seen[ct.To] = true
	}
	if len(seen) != len(s.nb[from]) {
		return fmt.Errorf("%w: %d shares for %d neighbors", ErrMismatch, len(seen), len(s.nb[from]))
	}
	s.shares[from] = cts
	return nil
}

// CloseShares ends step 2: each client's inbox (the shares addressed to it
// by the clients that sent theirs).
func (s *Server) CloseShares() (map[ID][]Ciphertext, error) {
	if s.phase != PhaseShare {
		return nil, ErrPhase
	}
	if len(s.shares) < s.threshold {
		return nil, fmt.Errorf("%w: %d sent shares", ErrTooFew, len(s.shares))
	}
	s.phase = PhaseMask
	inbox := map[ID][]Ciphertext{}
	for _, from := range sortedIDs(s.shares) {
		for _, ct := range s.shares[from] {
			if _, ok := s.shares[ct.To]; ok {
				inbox[ct.To] = append(inbox[ct.To], ct)
			}
		}
	}
	return inbox, nil
}

// Masked takes a client's masked input.
func (s *Server) Masked(from ID, y []uint32) error {
	if s.phase != PhaseMask {
		return ErrPhase
	}
	if _, ok := s.shares[from]; !ok {
		return fmt.Errorf("%w: %d sent no shares", ErrUnknown, from)
	}
	if _, dup := s.masked[from]; dup {
		return fmt.Errorf("%w: %d sent its input twice", ErrMismatch, from)
	}
	if len(y) != s.n {
		return fmt.Errorf("%w: %d values, want %d", ErrMismatch, len(y), s.n)
	}
	s.masked[from] = y
	return nil
}

// CloseMasked ends step 3: the survivors, whom every survivor is told.
func (s *Server) CloseMasked() ([]ID, error) {
	if s.phase != PhaseMask {
		return nil, ErrPhase
	}
	if len(s.masked) < s.threshold {
		return nil, fmt.Errorf("%w: %d masked inputs", ErrTooFew, len(s.masked))
	}
	s.phase = PhaseUnmask
	s.survivors = sortedIDs(s.masked)
	return slices.Clone(s.survivors), nil
}

// Unmask takes a survivor's reveal: shares of b for exactly the survivors
// and of s for exactly the dropouts of the share set.
func (s *Server) Unmask(r *Reveal) error {
	if s.phase != PhaseUnmask {
		return ErrPhase
	}
	if _, ok := s.masked[r.From]; !ok {
		return fmt.Errorf("%w: %d is not a survivor", ErrUnknown, r.From)
	}
	if _, dup := s.reveals[r.From]; dup {
		return fmt.Errorf("%w: %d revealed twice", ErrMismatch, r.From)
	}
	// It holds shares of itself and of its neighbors that sent theirs: of b
	// for the survivors, of s for the dropouts, exactly.
	wantB, wantS := 0, 0
	for v := range s.shares {
		if v != r.From && !s.nb[r.From][v] {
			continue
		}
		if s.masked[v] != nil {
			wantB++
		} else {
			wantS++
		}
	}
	if len(r.B) != wantB || len(r.S) != wantS {
		return fmt.Errorf("%w: %d b shares and %d s shares, want %d and %d", ErrMismatch, len(r.B), len(r.S), wantB, wantS)
	}
	for id := range r.B {
		if _, ok := s.masked[id]; !ok || (id != r.From && !s.nb[r.From][id]) {
			return fmt.Errorf("%w: a b share of %d, not a surviving neighbor", ErrMismatch, id)
		}
	}
	for id := range r.S {
		if _, sent := s.shares[id]; !sent || s.masked[id] != nil || !s.nb[r.From][id] {
			return fmt.Errorf("%w: an s share of %d, not a neighbor that dropped", ErrMismatch, id)
		}
	}
	s.reveals[r.From] = r
	return nil
}

// Reveals is how many survivors have revealed.
func (s *Server) Reveals() int { return len(s.reveals) }

// Finish rebuilds the masks from the reveals (at least the threshold) and
// returns the sum of the survivors' inputs, mod 2³².
func (s *Server) Finish() ([]uint32, error) {
	if s.phase != PhaseUnmask {
		return nil, ErrPhase
	}
	if len(s.reveals) < s.threshold {
		return nil, fmt.Errorf("%w: %d reveals", ErrTooFew, len(s.reveals))
	}
	holders := sortedIDs(s.reveals)
	// rebuild combines the shares of of's secret that the revealers hold
	// (its neighbors', and its own if it revealed).
	rebuild := func(of ID, pick func(*Reveal) ([32]byte, bool)) ([]byte, error) {
		var xs []byte
		var shares [][]byte
		for _, h := range holders {
			if sh, ok := pick(s.reveals[h]); ok {
				xs = append(xs, byte(h))
				shares = append(shares, sh[:])
			}
		}
		if len(xs) < s.threshold {
			return nil, fmt.Errorf("%w: %d shares of %d's secret revealed, threshold %d", ErrShares, len(xs), of, s.threshold)
		}
		return combine(xs, shares, s.threshold)
	}
	sum := make([]uint32, s.n)
	for _, u := range s.survivors {
		for i, v := range s.masked[u] {
			sum[i] += v
		}
		b, err := rebuild(u, func(r *Reveal) ([32]byte, bool) { v, ok := r.B[u]; return v, ok })
		if err != nil {
			return nil, err
		}
		self := prg([32]byte(b), s.n)
		for i := range sum {
			sum[i] -= self[i]
		}
	}
	for _, v := range sortedIDs(s.shares) {
		if s.masked[v] != nil {
			continue
		}
		raw, err := rebuild(v, func(r *Reveal) ([32]byte, bool) { x, ok := r.S[v]; return x, ok })
		if err != nil {
			return nil, err
		}
		sk, err := ecdh.X25519().NewPrivateKey(raw)
		if err != nil {
			return nil, err
		}
		if pub := s.keys[v].S; string(sk.PublicKey().Bytes()) != string(pub[:]) {
			return nil, fmt.Errorf("%w: the s key rebuilt for %d does not match its advertised key", ErrShares, v)
		}
		// Remove the masks v's surviving neighbors added for their pairs
		// with it.
		for _, u := range s.survivors {
			if !s.nb[v][u] {
				continue
			}
			if err := addPairMask(sum, u, v, sk, s.keys[u].S, -1); err != nil {
				return nil, err
			}
		}
	}
	s.phase = PhaseDone
	return sum, nil
}
