package f32le

import (
	"bytes"
	"math"
	"testing"
)

// The layout is IEEE 754 binary32, little-endian: pinned bytes for values
// whose bits are known, including a negative zero, an infinity and a NaN.
func TestLayout(t *testing.T) {
	vals := []float32{1, -2, float32(math.Copysign(0, -1)), float32(math.Inf(1)), math.Float32frombits(0x7fc00001)}
	want := []byte{
		0x00, 0x00, 0x80, 0x3f,
		0x00, 0x00, 0x00, 0xc0,
		0x00, 0x00, 0x00, 0x80,
		0x00, 0x00, 0x80, 0x7f,
		0x01, 0x00, 0xc0, 0x7f,
	}
	if got := Append([]byte{9}, vals); !bytes.Equal(got, append([]byte{9}, want...)) {
		t.Fatalf("Append = % x", got)
	}
	got := make([]float32, len(vals))
	Decode(got, want)
	for i := range vals {
		if math.Float32bits(got[i]) != math.Float32bits(vals[i]) {
			t.Errorf("value %d: bits %08x, want %08x", i, math.Float32bits(got[i]), math.Float32bits(vals[i]))
		}
	}
}

func BenchmarkAppend(b *testing.B) {
	vals := make([]float32, 1<<16)
	buf := make([]byte, 0, 4*len(vals))
	b.SetBytes(int64(4 * len(vals)))
	for b.Loop() {
		buf = Append(buf[:0], vals)
	}
}
