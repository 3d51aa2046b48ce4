package data

import (
	"slices"
	"testing"
)

// permutationOrder lists perm(0), …, perm(n−1).
func permutationOrder(n, seed uint64) []uint64 {
	p := newPermutation(n, seed)
	order := make([]uint64, n)
	for i := range order {
		order[i] = p.at(uint64(i))
	}
	return order
}

func TestPermutationIsABijection(t *testing.T) {
	for _, n := range []uint64{1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 100, 255, 256, 257, 1000, 4097, 65537} {
		for _, seed := range []uint64{0, 1, 2, 1 << 63} {
			order := permutationOrder(n, seed)
			seen := make([]bool, n)
			for i, v := range order {
				if v >= n {
					t.Fatalf("n=%d seed=%d: perm(%d) = %d out of range", n, seed, i, v)
				}
				if seen[v] {
					t.Fatalf("n=%d seed=%d: %d produced twice", n, seed, v)
				}
				seen[v] = true
			}
		}
	}
}

func TestPermutationSeedsGiveDifferentOrders(t *testing.T) {
	const n = 1000
	orders := map[uint64][]uint64{}
	for seed := range uint64(16) {
		order := permutationOrder(n, seed)
		fixed := 0
		for i, v := range order {
			if uint64(i) == v {
				fixed++
			}
		}
		// A random permutation has one fixed point on average; file order
		// or a near-identity would have hundreds.
		if fixed > 10 {
			t.Errorf("seed %d: %d fixed points of %d, not shuffled", seed, fixed, n)
		}
		for other, o := range orders {
			same := 0
			for i := range order {
				if order[i] == o[i] {
					same++
				}
			}
			if same > 10 {
				t.Errorf("seeds %d and %d agree on %d of %d positions", seed, other, same, n)
			}
		}
		orders[seed] = order
	}
}

func TestPermutationWorksAtTheTopOfTheRange(t *testing.T) {
	for _, n := range []uint64{1 << 62, 1<<63 + 12345, ^uint64(0)} {
		p := newPermutation(n, 9)
		seen := map[uint64]bool{}
		for x := range uint64(1000) {
			v := p.at(x)
			if v >= n || seen[v] {
				t.Fatalf("n=%d: perm(%d) = %d repeated or out of range", n, x, v)
			}
			seen[v] = true
		}
		for _, x := range []uint64{n - 1, n - 2, n / 2} {
			if v := p.at(x); v >= n {
				t.Fatalf("n=%d: perm(%d) = %d out of range", n, x, v)
			}
		}
	}
}

// TestPermutationGolden pins the shuffle: trainers on different machines and
// versions must agree on which sequence a data index means. If this fails,
// the data order of every shuffled run changed.
func TestPermutationGolden(t *testing.T) {
	for _, tc := range []struct {
		n, seed uint64
		want    []uint64
	}{
		{10, 1, []uint64{4, 9, 8, 7, 3, 0, 5, 1}},
		{1000, 42, []uint64{292, 119, 742, 808, 344, 330, 449, 153}},
		{1 << 40, 7, []uint64{0x4db247dd1a, 0xe64f580ca8, 0x46d839072e, 0x70cfcdf252, 0xf3fc322909, 0xe9a737898b, 0xfb93eb2ddf, 0xba11dbccb6}},
	} {
		p := newPermutation(tc.n, tc.seed)
		got := make([]uint64, 8)
		for i := range got {
			got[i] = p.at(uint64(i))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("n=%d seed=%d: first values %#v, want %#v", tc.n, tc.seed, got, tc.want)
		}
	}
}
