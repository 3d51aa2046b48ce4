package p2p

import (
	"bytes"
	"context"
	"io"
	"slices"
	"testing"
)

// A source's bytes are its tensors back to back: reads that start inside
// one tensor and end in another, reads past the end, and the manifest of a
// source equal to the manifest of the same tensors split directly.
func TestTensorsSource(t *testing.T) {
	ts := []Tensor{
		{Name: "a", DType: "F32", Shape: []uint64{2}, Data: []byte{0, 1, 2, 3, 4, 5, 6, 7}},
		{Name: "b", DType: "F32", Shape: []uint64{}, Data: []byte{8, 9, 10, 11}},
		{Name: "c", DType: "F32", Shape: []uint64{0}, Data: []byte{}},
		{Name: "d", DType: "F32", Shape: []uint64{1, 1}, Data: []byte{12, 13, 14, 15}},
	}
	src := TensorsSource(ts)
	for _, c := range []struct {
		off, n int
		want   []byte
		eof    bool
	}{
		{0, 16, []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, false},
		{6, 4, []byte{6, 7, 8, 9}, false},
		{11, 2, []byte{11, 12}, false},
		{14, 4, []byte{14, 15}, true},
		{16, 1, nil, true},
	} {
		p := make([]byte, c.n)
		n, err := src.ReadAt(p, int64(c.off))
		if !bytes.Equal(p[:n], c.want) || (err == io.EOF) != c.eof || (err != nil && err != io.EOF) {
			t.Errorf("ReadAt(%d bytes at %d) = % x, %v; want % x, EOF %v", c.n, c.off, p[:n], err, c.want, c.eof)
		}
	}
	m, starts, err := Manifest(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(starts, []uint64{0, 8, 12, 12}) {
		t.Errorf("starts = %v", starts)
	}
	for i, e := range m.Tensors {
		if e.Blob.Size != uint64(len(ts[i].Data)) || !slices.Equal(e.Blob.Blocks, BlockDigests(ts[i].Data)) {
			t.Errorf("tensor %s: %d bytes in %d blocks, want its own", e.Name, e.Blob.Size, len(e.Blob.Blocks))
		}
	}
	back, err := ReadTensors(src)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		if !bytes.Equal(back[i].Data, ts[i].Data) || back[i].Name != ts[i].Name {
			t.Errorf("tensor %d read back as %s % x", i, back[i].Name, back[i].Data)
		}
	}
	bad := TensorsSource([]Tensor{{Name: "x", DType: "Q4", Shape: []uint64{2}, Data: []byte{1}}})
	if _, _, err := Manifest(context.Background(), bad); err == nil {
		t.Error("a dtype checkpoints do not carry was accepted")
	}
}
