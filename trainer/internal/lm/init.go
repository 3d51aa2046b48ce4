package lm

import (
	"fmt"
	"math/rand/v2"
	"sort"
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
// draws each value once. A read elsewhere resumes from the stream's state
// saved at the last mark before its place (every markEvery draws, saved as
// the stream first passes them), when that is behind the stream or nearer
// than the stream's place: a checkpoint's order, which visits each stacked
// tensor one layer at a time between the others, costs one sweep of the
// stream and then at most a mark's worth of skipped draws a read, where
// starting again from the seed, and skipping forward draw by draw, made
// writing a model quadratic in its size (a 0.5B Llama: 300 s against 20 s
// for building it whole).
type Seeded struct {
	inits        []Init
	sizes        []int
	seed, stream uint64
	every        int // draws between marks

	mu    sync.Mutex
	src   *rand.PCG
	r     *rand.Rand
	next  int // draws taken from src so far
	taken int // draws taken since NewSeeded, resumes and all (tests)
	marks []mark
	// before[i] is how many normal draws the tensors before i take.
	before []int
}

// mark is the stream's state after at draws.
type mark struct {
	at    int
	state []byte
}

// markEvery is how many draws a mark is saved after: a 1B model's stream
// keeps about 1,200 of 20 bytes, and a read skips at most about 10 ms of
// draws to reach its place.
const markEvery = 1 << 20

// NewSeeded reads what Draw(tensors of sizes, inits, seed, stream) writes.
func NewSeeded(sizes []int, inits []Init, seed, stream uint64) (*Seeded, error) {
	if len(sizes) != len(inits) {
		return nil, fmt.Errorf("lm: %d tensors, %d initialisations", len(sizes), len(inits))
	}
	s := &Seeded{inits: inits, sizes: sizes, seed: seed, stream: stream, every: markEvery, before: make([]int, len(sizes))}
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
	if k := s.markAtOrBefore(at); s.r == nil || at < s.next || (k >= 0 && s.marks[k].at > s.next) {
		// Behind the stream, or a mark is nearer ahead than the stream's
		// place: a checkpoint's order jumps forward over the layers
		// between too.
		if err := s.resume(k); err != nil {
			return err
		}
	}
	for s.next < at {
		s.r.NormFloat64()
		s.advanced(1)
	}
	// The draws into dst, cut where marks fall (each value is still the
	// stream's next draw, in order).
	for len(dst) > 0 {
		n := min(len(dst), s.every-s.next%s.every)
		Normal(s.r, dst[:n], in.Std)
		s.advanced(n)
		dst = dst[n:]
	}
	return nil
}

// markAtOrBefore is the index of the last mark at or before draw at (-1:
// none).
func (s *Seeded) markAtOrBefore(at int) int {
	return sort.Search(len(s.marks), func(j int) bool { return s.marks[j].at > at }) - 1
}

// resume puts the stream at mark k (its start if k is -1).
func (s *Seeded) resume(k int) error {
	s.src = rand.NewPCG(s.seed, s.stream)
	s.r, s.next = rand.New(s.src), 0
	if k < 0 {
		return nil
	}
	if err := s.src.UnmarshalBinary(s.marks[k].state); err != nil {
		return fmt.Errorf("lm: a saved stream state: %w", err)
	}
	s.next = s.marks[k].at
	return nil
}

// advanced counts n draws taken and saves a mark where the stream first
// reaches one.
func (s *Seeded) advanced(n int) {
	s.next += n
	s.taken += n
	if s.next%s.every != 0 || (len(s.marks) > 0 && s.marks[len(s.marks)-1].at >= s.next) {
		return
	}
	state, err := s.src.MarshalBinary()
	if err != nil {
		return // a mark not saved: a later read behind it draws further
	}
	s.marks = append(s.marks, mark{at: s.next, state: state})
}
