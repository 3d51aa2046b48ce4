package p2p

import (
	"bytes"
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
)

// Bytes appended in pieces of any size land tensor after tensor, and the
// manifest digested as they were written is the one a full read of the
// file gives: blocks cut at each tensor's start, tensors of no bytes with
// no blocks.
func TestCheckpointFileAppend(t *testing.T) {
	specs := []TensorSpec{
		{Name: "a", DType: "F32", Shape: []uint64{BlockSize/4 + 3}},
		{Name: "empty", DType: "F32", Shape: []uint64{0}},
		{Name: "b", DType: "F32", Shape: []uint64{5}},
		{Name: "c", DType: "F32", Shape: []uint64{2, BlockSize / 4}},
	}
	var ts []Tensor
	var all []byte
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range specs {
		size, err := TensorSize(s)
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		ts = append(ts, Tensor{Name: s.Name, DType: s.DType, Shape: s.Shape, Data: data})
		all = append(all, data...)
	}
	want, wantStarts, err := Manifest(context.Background(), TensorsSource(ts))
	if err != nil {
		t.Fatal(err)
	}
	for _, piece := range []int{1 << 16, 7, BlockSize + 1, len(all)} {
		f, err := NewCheckpointFile(specs)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(all); off += piece {
			if f.Complete() {
				t.Fatalf("pieces of %d: complete before the end", piece)
			}
			if err := f.Append(all[off:min(off+piece, len(all))]); err != nil {
				t.Fatal(err)
			}
		}
		if !f.Complete() {
			t.Fatalf("pieces of %d: not complete after every byte", piece)
		}
		if err := f.Append([]byte{0}); err == nil {
			t.Errorf("pieces of %d: a byte past the end was taken", piece)
		}
		got, starts, err := Manifest(context.Background(), f)
		if err != nil || !reflect.DeepEqual(got, want) || !reflect.DeepEqual(starts, wantStarts) {
			t.Fatalf("pieces of %d: manifest %+v at %v, %v; want %+v at %v", piece, got, starts, err, want, wantStarts)
		}
		back, err := ReadTensors(f)
		if err != nil || !reflect.DeepEqual(back, ts) {
			t.Fatalf("pieces of %d: the file holds other bytes (%v)", piece, err)
		}
		f.Close()
	}
}

// A file written at offsets (a fetch) knows no manifest until it is told
// the verified one, writes outside the tensors are refused, and a dtype
// checkpoints do not carry cannot be made.
func TestCheckpointFileWriteAt(t *testing.T) {
	specs := []TensorSpec{{Name: "w", DType: "F32", Shape: []uint64{4}}}
	f, err := NewCheckpointFile(specs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Size() != 16 {
		t.Fatalf("Size = %d, want 16", f.Size())
	}
	data := []byte("0123456789abcdef")
	if _, err := f.WriteAt(data[8:], 8); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data[:8], 0); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{-1, 9} {
		if _, err := f.WriteAt(data[:8], off); err == nil {
			t.Errorf("8 bytes at %d of 16 were written", off)
		}
	}
	if f.Complete() {
		t.Fatal("a file written at offsets is complete before it is verified")
	}
	want, _, err := Manifest(context.Background(), f) // read and digested
	if err != nil {
		t.Fatal(err)
	}
	f.Verified(want)
	if !f.Complete() {
		t.Fatal("not complete once verified")
	}
	got := make([]byte, 16)
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadAt = %q, %v", got, err)
	}
	if _, err := NewCheckpointFile([]TensorSpec{{Name: "h", DType: "F16", Shape: []uint64{2}}}); err == nil {
		t.Error("a file of F16 tensors was made")
	}
}
