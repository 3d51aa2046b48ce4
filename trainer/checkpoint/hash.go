package checkpoint

import (
	"context"
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
	sum, err := Hash(context.Background(), tensors)
	if err != nil {
		// Only a Fill can fail, and HashTensors is for tensors that hold
		// their data.
		panic(err)
	}
	return sum
}

// Hash is HashTensors of tensors whose values may come from Fill, read a
// chunk at a time; it fails when a Fill does or ctx ends.
func Hash(ctx context.Context, tensors []Tensor) ([sha256.Size]byte, error) {
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
	var scratch []float32
	for i := range tensors {
		t := &tensors[i]
		u64(uint64(len(t.Name)))
		room(len(t.Name))
		buf = append(buf, t.Name...)
		u64(uint64(len(t.Shape)))
		for _, d := range t.Shape {
			u64(uint64(d))
		}
		u64(4 * uint64(t.len()))
		err := t.chunks(ctx, &scratch, chunkSize/4, func(data []float32) error {
			for _, v := range data {
				room(4)
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			}
			return nil
		})
		if err != nil {
			return [sha256.Size]byte{}, err
		}
	}
	h.Write(buf)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum, nil
}
