package data

import (
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
)

// feistelRounds is enough rounds of a good round function for the output
// order to look random; the permutation property holds for any count.
const feistelRounds = 8

// permutation is a keyed pseudo-random bijection of [0, n) that is computed
// per element, in O(1) memory, however large n is: a balanced Feistel network
// over the smallest even number of bits 2h with 2^(2h) ≥ n, restricted to
// [0, n) by cycle-walking (apply the network again until the value lands in
// range). A Feistel network is a bijection of [0, 2^(2h)) whatever its round
// function, and cycle-walking keeps a bijection of the subset; since
// 2^(2h) < 4n, a walk takes fewer than four steps on average.
//
// The values it produces are part of the data contract: every trainer must
// map data indices to the same sequences, so changing anything here changes
// what a run trains on. TestPermutationGolden pins them.
type permutation struct {
	n        uint64
	halfBits uint
	mask     uint64
	keys     [feistelRounds]uint64
}

// newPermutation returns the permutation of [0, n) for seed; n must be ≥ 1.
func newPermutation(n, seed uint64) *permutation {
	half := uint(bits.Len64(n-1)+1) / 2
	if half == 0 {
		half = 1
	}
	p := &permutation{n: n, halfBits: half, mask: 1<<half - 1}
	// The round keys come from SHA-256 of the seed and n, so that nearby
	// seeds (and one seed over different file lengths) give unrelated orders.
	const tag = "psyche data shuffle"
	var msg [len(tag) + 8 + 8 + 1]byte // tag, seed, n, round
	copy(msg[:], tag)
	binary.LittleEndian.PutUint64(msg[len(tag):], seed)
	binary.LittleEndian.PutUint64(msg[len(tag)+8:], n)
	for r := range p.keys {
		msg[len(msg)-1] = byte(r)
		sum := sha256.Sum256(msg[:])
		p.keys[r] = binary.LittleEndian.Uint64(sum[:8])
	}
	return p
}

// at returns the image of x, which must be below n.
func (p *permutation) at(x uint64) uint64 {
	for {
		x = p.feistel(x)
		if x < p.n {
			return x
		}
	}
}

// feistel is the bijection of [0, 2^(2h)).
func (p *permutation) feistel(x uint64) uint64 {
	left, right := x>>p.halfBits, x&p.mask
	for _, k := range p.keys {
		left, right = right, left^(mix64(right^k)&p.mask)
	}
	return left<<p.halfBits | right
}

// mix64 is the SplitMix64 finalizer: every input bit affects every output bit.
func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	z ^= z >> 31
	return z
}
