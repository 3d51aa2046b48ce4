package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"strings"
	"testing"
)

// FuzzDecode checks that Decode never panics and fails only with this
// package's format errors, and that whatever it accepts survives a round
// trip: re-encoding gives a file that decodes to the same tensors and
// metadata, and is canonical (encoding it again changes nothing).
func FuzzDecode(f *testing.F) {
	seeds := [][]byte{
		nil,
		{0, 0, 0, 0, 0, 0, 0, 0},
		file(`{}`, nil),
		file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32bytes(1, 2)),
		file(`{"a":{"dtype":"F16","shape":[1,2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[],"data_offsets":[4,6]}}`,
			[]byte{0x00, 0x3c, 0x01, 0x7e, 0xc0, 0x3f}),
		file(`{"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"__metadata__":{"k":"v","\u0000":""}}`, nil),
		file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32bytes(1, 2)),
		file(`{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}),
		file(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, nil),
		binary.LittleEndian.AppendUint64(nil, 1<<62),
	}
	for _, tensors := range [][]Tensor{
		randomTensors(newRand(1), 5),
		{{Name: "x", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}}, {Name: "y", Data: []float32{-0.5}}},
	} {
		enc, err := Encode(tensors, map[string]string{"step": "3"})
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, enc)
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || !strings.HasPrefix(err.Error(), "checkpoint: ") {
				t.Fatalf("Decode error is not a format error: %v", err)
			}
			return
		}
		tensors, meta := c.Tensors(), c.Metadata()
		enc, err := Encode(tensors, meta)
		if err != nil {
			t.Fatalf("an accepted checkpoint does not re-encode: %v", err)
		}
		c2, err := Decode(enc)
		if err != nil {
			t.Fatalf("a re-encoded checkpoint does not decode: %v", err)
		}
		sameTensors(t, c2.Tensors(), tensors)
		if !maps.Equal(c2.Metadata(), meta) {
			t.Fatalf("metadata changed: %v -> %v", meta, c2.Metadata())
		}
		enc2, err := Encode(c2.Tensors(), c2.Metadata())
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not canonical (err %v)", err)
		}
	})
}
