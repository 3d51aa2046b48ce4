package torch

import (
	"bytes"
	"testing"
)

// TestTensorsWrittenAsBlobs: tensors handed to writeMessage make the bytes
// their float32 blobs would (lengths in the header, values little-endian),
// across the chunks they are encoded in, after the byte blobs.
func TestTensorsWrittenAsBlobs(t *testing.T) {
	big := make([]float32, 2*tensorChunk+3)
	for i := range big {
		big[i] = float32(i) / 7
	}
	for _, tc := range []struct {
		name    string
		blobs   [][]byte
		tensors [][]float32
	}{
		{"none", nil, nil},
		{"bytes only", [][]byte{{1, 2, 3}}, nil},
		{"tensors only", nil, [][]float32{{1.5, -2}, big}},
		{"both, an empty tensor", [][]byte{{9}}, [][]float32{big, {}, {3}}},
	} {
		var got, want bytes.Buffer
		if err := writeMessage(&got, bare("open"), tc.blobs, sliceBlobs(tc.tensors)); err != nil {
			t.Fatal(err)
		}
		all := append([][]byte{}, tc.blobs...)
		for _, v := range tc.tensors {
			all = append(all, f32Bytes(v))
		}
		if err := writeMessage(&want, bare("open"), all, tensorBlobs{}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("%s: the message differs from the one with the tensors' bytes as blobs", tc.name)
		}
	}
}
