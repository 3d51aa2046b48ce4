package coordinator

import (
	"encoding/binary"

	"github.com/bits-and-blooms/bloom/v3"
)

// Witness blooms are bits-and-blooms/bloom/v3 filters of m = 2560 bits and
// k = 7 hashes (about 0.8% false positives with 256 members). The element
// added for a member is le64(key) ‖ member: 40 bytes, where key is the
// witness's own random key, so two witnesses' false positives are
// independent. The C program recomputes the library's bit positions for the
// same 40-byte elements; the differential tests keep the two in step.

func bloomElement(key uint64, member Hash) [40]byte {
	var e [40]byte
	binary.LittleEndian.PutUint64(e[:8], key)
	copy(e[8:], member[:])
	return e
}

// filter wraps the words of b without copying them: the library's bitset
// uses the slice it is given, so Add writes straight into b.
func (b *Bloom) filter() *bloom.BloomFilter {
	return bloom.From(b[:], BloomHashes)
}

// Add puts member into the bloom under the witness key.
func (b *Bloom) Add(key uint64, member Hash) {
	e := bloomElement(key, member)
	b.filter().Add(e[:])
}

// Has reports whether member may be in the bloom (no false negatives).
func (b *Bloom) Has(key uint64, member Hash) bool {
	e := bloomElement(key, member)
	return b.filter().Test(e[:])
}

// Count returns the number of set bits.
func (b *Bloom) Count() int {
	return int(b.filter().BitSet().Count())
}
