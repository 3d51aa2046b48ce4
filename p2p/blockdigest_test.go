package p2p

import (
	"crypto/sha256"
	"testing"

	"lukechampine.com/blake3"
)

// BenchmarkBlockDigest hashes one 1 MiB block, as a fetcher does with every
// block it receives: BlockDigest (BLAKE3, walked on one goroutine) beside
// the library's Sum256 of the same bytes (its goroutine per 16 KiB) and
// sha2-256 (the digest before). Compare with -cpu 1 too: the round that
// verifies blocks has no idle core to lend.
func BenchmarkBlockDigest(b *testing.B) {
	data := randomBytes(1, BlockSize)
	for _, c := range []struct {
		name string
		sum  func([]byte) [32]byte
	}{
		{"BlockDigest", func(b []byte) [32]byte { return BlockDigest(b) }},
		{"blake3.Sum256", blake3.Sum256},
		{"sha256", sha256.Sum256},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(BlockSize)
			for b.Loop() {
				c.sum(data)
			}
		})
	}
}
