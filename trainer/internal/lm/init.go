package lm

import (
	"fmt"
	"math/rand/v2"
	"sync"
)

// Init is how a model's New fills one parameter tensor: zeros, ones, or
// draws from N(0, Std²).
type Init struct {
	Std  float64 // > 0: normal draws
	Ones bool
}

// Draw fills tensors (a model's, Shapes order) as inits say, every normal
// draw from one stream (PCG seeded with seed and stream), tensor after
// tensor: the one definition of a model's initial weights, which Seeded
// reproduces a range at a time.
func Draw(tensors [][]float32, inits []Init, seed, stream uint64) {
	r := rand.New(rand.NewPCG(seed, stream))
	for i, t := range tensors {
		fill(r, t, inits[i])
	}
}

func fill(r *rand.Rand, v []float32, in Init) {
	switch {
	case in.Std > 0:
		Normal(r, v, in.Std)
	case in.Ones:
		Ones(v)
	default:
		clear(v)
	}
}

// Seeded reads the initial weights Draw would write, a range at a time,
// without holding them: a model of gigabytes drawn for an engine that holds
// it elsewhere (a PyTorch worker) never exists whole in this process. The
// stream's place is kept between reads, so reading the tensors in order
// draws each value once; a read behind it starts the stream again from the
// seed (a second pass, for a hash).
type Seeded struct {
	inits        []Init
	sizes        []int
	seed, stream uint64

	mu   sync.Mutex
	r    *rand.Rand
	next int // draws taken from r so far
	// before[i] is how many normal draws the tensors before i take.
	before []int
}

// NewSeeded reads what Draw(tensors of sizes, inits, seed, stream) writes.
func NewSeeded(sizes []int, inits []Init, seed, stream uint64) (*Seeded, error) {
	if len(sizes) != len(inits) {
		return nil, fmt.Errorf("lm: %d tensors, %d initialisations", len(sizes), len(inits))
	}
	s := &Seeded{inits: inits, sizes: sizes, seed: seed, stream: stream, before: make([]int, len(sizes))}
	n := 0
	for i, in := range inits {
		s.before[i] = n
		if in.Std > 0 {
			n += sizes[i]
		}
	}
	return s, nil
}

// Read writes values [off, off+len(dst)) of tensor i into dst.
func (s *Seeded) Read(i, off int, dst []float32) error {
	if i < 0 || i >= len(s.sizes) || off < 0 || off+len(dst) > s.sizes[i] {
		return fmt.Errorf("lm: values [%d, %d) of tensor %d are outside the model", off, off+len(dst), i)
	}
	in := s.inits[i]
	if in.Std <= 0 {
		fill(nil, dst, in)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.before[i] + off
	if s.r == nil || at < s.next {
		s.r, s.next = rand.New(rand.NewPCG(s.seed, s.stream)), 0
	}
	for ; s.next < at; s.next++ {
		s.r.NormFloat64()
	}
	Normal(s.r, dst, in.Std)
	s.next += len(dst)
	return nil
}
