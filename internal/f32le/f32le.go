// Package f32le owns the one byte layout float32 values take wherever the
// trainer moves them as bytes (checkpoints, P2P checkpoints, the PyTorch
// worker's wire): IEEE 754 binary32, little-endian, four bytes each.
package f32le

import (
	"encoding/binary"
	"math"
)

// Put writes src into dst, which holds at least 4·len(src) bytes.
func Put(dst []byte, src []float32) {
	_ = dst[:4*len(src)] // one bounds check for the loop
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

// Append appends src's bytes to dst.
func Append(dst []byte, src []float32) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, 4*len(src))...)
	Put(dst[n:], src)
	return dst
}

// Decode reads len(dst) values from src, which holds at least 4·len(dst)
// bytes.
func Decode(dst []float32, src []byte) {
	_ = src[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}
