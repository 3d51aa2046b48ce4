package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

// filled is tensors with their values moved behind Fill, which records the
// ranges it is asked for.
func filled(tensors []Tensor, asked *[][3]int) []Tensor {
	out := make([]Tensor, len(tensors))
	for i, t := range tensors {
		data := t.Data
		out[i] = Tensor{Name: t.Name, Shape: t.Shape, DType: t.DType, Fill: func(ctx context.Context, off int, dst []float32) error {
			*asked = append(*asked, [3]int{i, off, len(dst)})
			copy(dst, data[off:])
			return nil
		}}
	}
	return out
}

// TestFillWritesWhatDataWrites: tensors whose values come from Fill, in
// chunks, make the same file bytes and the same hash as tensors holding
// them, in every dtype, and Fill is asked for each value once, in order.
func TestFillWritesWhatDataWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	values := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = r.Float32()*2 - 1
		}
		return v
	}
	big := chunkSize/4 + 1000 // more than one chunk
	for _, dtype := range []string{"", "F32", "F16", "BF16"} {
		tensors := []Tensor{
			{Name: "z.big", Shape: []int{big}, Data: values(big), DType: dtype},
			{Name: "a.matrix", Shape: []int{3, 5}, Data: values(15), DType: dtype},
			{Name: "empty", Shape: []int{0, 4}, Data: []float32{}, DType: dtype},
			{Name: "scalar", Shape: []int{}, Data: values(1), DType: dtype},
		}
		meta := map[string]string{"run": "r"}
		want, err := Encode(tensors, meta)
		if err != nil {
			t.Fatal(err)
		}
		var asked [][3]int
		var got bytes.Buffer
		if _, err := Write(context.Background(), &got, filled(tensors, &asked), meta); err != nil {
			t.Fatalf("%q: %v", dtype, err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("%q: the file from Fill differs from the file from Data", dtype)
		}
		// Every value asked for once, in order, per tensor.
		next := map[int]int{}
		for _, a := range asked {
			if a[1] != next[a[0]] {
				t.Fatalf("%q: tensor %d asked at %d, want %d (asked %v)", dtype, a[0], a[1], next[a[0]], asked)
			}
			next[a[0]] += a[2]
		}
		for i, tn := range tensors {
			if next[i] != len(tn.Data) {
				t.Fatalf("%q: tensor %s: %d values asked for, it has %d", dtype, tn.Name, next[i], len(tn.Data))
			}
		}
		asked = nil
		sum, err := Hash(context.Background(), filled(tensors, &asked))
		if err != nil || sum != HashTensors(tensors) {
			t.Fatalf("%q: Hash of filled tensors %x, %v; of the data %x", dtype, sum, err, HashTensors(tensors))
		}
	}
}

// TestFillErrors: a failing Fill fails the write and the hash and names
// the tensor (a save leaves no file); a Fill-less tensor without data is refused as before.
func TestFillErrors(t *testing.T) {
	boom := errors.New("the worker is gone")
	tensors := []Tensor{
		{Name: "ok", Shape: []int{2}, Data: []float32{1, 2}},
		{Name: "lost", Shape: []int{4}, Fill: func(context.Context, int, []float32) error { return boom }},
	}
	if _, err := Write(context.Background(), &bytes.Buffer{}, tensors, nil); !errors.Is(err, boom) || !bytes.Contains([]byte(err.Error()), []byte("lost")) {
		t.Fatalf("Write = %v, want the Fill's error naming the tensor", err)
	}
	if _, err := Hash(context.Background(), tensors); !errors.Is(err, boom) {
		t.Fatalf("Hash = %v, want the Fill's error", err)
	}
	path := t.TempDir() + "/m.safetensors"
	if err := Save(context.Background(), path, tensors, nil); !errors.Is(err, boom) {
		t.Fatalf("Save = %v, want the Fill's error", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a failed save left %s behind (%v)", path, err)
	}
	if _, err := Encode([]Tensor{{Name: "none", Shape: []int{2}}}, nil); !errors.Is(err, ErrInvalidTensor) {
		t.Fatalf("Encode of a tensor with neither data nor Fill = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Hash(ctx, slices.Clone(tensors[:1])); !errors.Is(err, context.Canceled) {
		t.Fatalf("Hash under a cancelled context = %v", err)
	}
}
