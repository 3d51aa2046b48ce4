package p2p

import (
	"math/bits"
	"sync"

	"github.com/psyche-go/psyche/coordinator"
	"lukechampine.com/blake3/guts"
)

// BlockDigest names a raw block by its content: its unkeyed BLAKE3 hash,
// 32 bytes. Every byte a node receives is hashed once to check it against
// the name it was asked for, which made the digest the largest single cost
// of a round under sha2-256 (1.4 GB/s here even with the CPU's SHA
// extensions; BLAKE3 hashes sixteen 1 KiB chunks at once in vector
// registers). The same name is the block's CID (BlockHashCode), so bitswap
// peers check it the same way.
//
// BLAKE3 is a tree: the input is cut into 1 KiB chunks, each chunk is
// compressed under its index, and nodes pair up, a left subtree always
// holding the largest power of two of chunks that leaves at least one for
// the right. The compression functions come from the library; the tree is
// walked here, on the caller's goroutine, because the library's own Sum256
// spreads an input over a goroutine per 16 KiB, which on a node whose cores
// are already busy moving a round costs more (goroutine starts and their
// stacks' growth) than it gains.
func BlockDigest(block []byte) coordinator.Hash {
	n := subtree(block, 0)
	n.Flags |= guts.FlagRoot
	words := guts.CompressNode(n)
	var h coordinator.Hash
	b := guts.WordsToBytes(words)
	copy(h[:], b[:])
	return h
}

// BlockHashCode is the multihash code of BlockDigest (BLAKE3), by which
// content-addressed stores and bitswap name its digests.
const BlockHashCode = 0x1e

// simdBytes is what one vectorised compression takes: sixteen chunks.
const simdBytes = guts.MaxSIMD * guts.ChunkSize

// tails holds the zero-padded copies of inputs shorter than simdBytes, which
// the vectorised compression needs whole.
var tails = sync.Pool{New: func() any { return new([simdBytes]byte) }}

// subtree is the (not yet final) node of the BLAKE3 subtree over data, whose
// first chunk has index counter.
func subtree(data []byte, counter uint64) guts.Node {
	switch {
	case len(data) == simdBytes:
		return guts.CompressBuffer((*[simdBytes]byte)(data), len(data), &guts.IV, counter, 0)
	case len(data) <= guts.ChunkSize:
		return guts.CompressChunk(data, &guts.IV, counter, 0)
	case len(data) < simdBytes:
		buf := tails.Get().(*[simdBytes]byte)
		copy(buf[:], data)
		clear(buf[len(data):])
		n := guts.CompressBuffer(buf, len(data), &guts.IV, counter, 0)
		tails.Put(buf)
		return n
	}
	chunks := uint64(len(data)+guts.ChunkSize-1) / guts.ChunkSize
	left := uint64(1) << (bits.Len64(chunks-1) - 1)
	l := subtree(data[:left*guts.ChunkSize], counter)
	r := subtree(data[left*guts.ChunkSize:], counter+left)
	return guts.ParentNode(guts.ChainingValue(l), guts.ChainingValue(r), &guts.IV, 0)
}
