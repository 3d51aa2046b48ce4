package lm

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSeededReadsAnyOrder: Seeded gives Draw's values whatever the order and
// size of its reads, in order, backwards, and at random (which resume from
// the marks, here every few draws), with zero and one tensors between.
func TestSeededReadsAnyOrder(t *testing.T) {
	sizes := []int{37, 5, 64, 3, 29}
	inits := []Init{{Std: 0.02}, {Ones: true}, {Std: 1}, {}, {Std: 0.5}}
	want := make([][]float32, len(sizes))
	for i, n := range sizes {
		want[i] = make([]float32, n)
	}
	Draw(want, inits, 11, 4)
	type read struct{ i, off, n int }
	inOrder := func(step int) []read {
		var out []read
		for i, n := range sizes {
			for off := 0; off < n; off += step {
				out = append(out, read{i, off, min(step, n-off)})
			}
		}
		return out
	}
	backwards := inOrder(6)
	slices.Reverse(backwards)
	shuffled := inOrder(4)
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
	for _, tc := range []struct {
		name  string
		every int
		reads []read
	}{
		{"in order, one read a tensor", markEvery, inOrder(64)},
		{"backwards, no marks", markEvery, backwards},
		{"backwards, a mark every 5 draws", 5, backwards},
		{"shuffled, a mark every 5 draws", 5, shuffled},
		{"shuffled, a mark every draw", 1, shuffled},
	} {
		s, err := NewSeeded(sizes, inits, 11, 4)
		if err != nil {
			t.Fatal(err)
		}
		s.every = tc.every
		got := make([][]float32, len(sizes))
		for i, n := range sizes {
			got[i] = make([]float32, n)
		}
		for _, rd := range tc.reads {
			if err := s.Read(rd.i, rd.off, got[rd.i][rd.off:rd.off+rd.n]); err != nil {
				t.Fatal(err)
			}
		}
		for i := range sizes {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("%s: tensor %d differs from Draw's", tc.name, i)
			}
		}
		if tc.every < markEvery && len(s.marks) == 0 {
			t.Errorf("%s: no mark was saved", tc.name)
		}
	}
}

// TestSeededLayerOrder: a checkpoint's order (two stacked tensors of four
// layers, read a layer of each in turn) draws the stream once and then at
// most a mark's worth a read, jumping forward by the marks as well as back.
func TestSeededLayerOrder(t *testing.T) {
	const layers, size, every = 4, 10, 5
	sizes := []int{layers * size, layers * size}
	inits := []Init{{Std: 1}, {Std: 1}}
	want := [][]float32{make([]float32, layers*size), make([]float32, layers*size)}
	Draw(want, inits, 3, 3)
	s, err := NewSeeded(sizes, inits, 3, 3)
	if err != nil {
		t.Fatal(err)
	}
	s.every = every
	reads := 0
	for l := range layers {
		for i := range sizes {
			got := make([]float32, size)
			if err := s.Read(i, l*size, got); err != nil {
				t.Fatal(err)
			}
			reads++
			if !slices.Equal(got, want[i][l*size:(l+1)*size]) {
				t.Fatalf("layer %d of tensor %d differs from Draw's", l, i)
			}
		}
	}
	if bound := 2*layers*size + reads*every; s.taken > bound {
		t.Errorf("took %d draws for a stream of %d read in %d pieces, want at most %d", s.taken, 2*layers*size, reads, bound)
	}
}
