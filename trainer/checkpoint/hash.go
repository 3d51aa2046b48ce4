package checkpoint

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
)

// HashTensors is the SHA-256 of tensors as a checkpoint holds them: for each
// tensor, in order, its name, its shape and its float32 little-endian data,
// each prefixed by its length (a uint64, little-endian: the name's and the
// data's in bytes, the shape's in dimensions), so no two different tensor
// lists hash the same bytes. DType is not hashed: it is how a file stores
// the values, not the values.
func HashTensors(tensors []Tensor) [sha256.Size]byte {
	h := sha256.New()
	buf := make([]byte, 0, 64<<10)
	// room makes sure buf can take n more bytes, hashing what it holds
	// first if it cannot (a hash.Hash's Write never fails).
	room := func(n int) {
		if cap(buf)-len(buf) < n {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	u64 := func(v uint64) {
		room(8)
		buf = binary.LittleEndian.AppendUint64(buf, v)
	}
	for _, t := range tensors {
		u64(uint64(len(t.Name)))
		room(len(t.Name))
		buf = append(buf, t.Name...)
		u64(uint64(len(t.Shape)))
		for _, d := range t.Shape {
			u64(uint64(d))
		}
		u64(4 * uint64(len(t.Data)))
		for _, v := range t.Data {
			room(4)
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
	}
	h.Write(buf)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
