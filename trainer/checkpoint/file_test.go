package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"testing"
)

// An opened file reads any range of any tensor, whatever its dtype, as
// Load decodes it, lists the tensors as the header does, and refuses a
// range outside a tensor and a tensor it does not hold.
func TestFileReadsRanges(t *testing.T) {
	values := make([]float32, 3*(chunkSize/2)+7) // several read chunks of a 2-byte dtype
	for i := range values {
		values[i] = float32(i%1000)/8 - 60
	}
	tensors := []Tensor{
		{Name: "big", Shape: []int{len(values)}, Data: values, DType: "BF16"},
		{Name: "half", Shape: []int{3, 5}, Data: values[:15], DType: "F16"},
		{Name: "full", Shape: []int{2, 2}, Data: values[100:104]},
		{Name: "scalar", Shape: []int{}, Data: values[7:8]},
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := Save(context.Background(), path, tensors, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	whole, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Limits{}.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !slices.EqualFunc(f.Tensors(), whole.Infos(), func(a, b TensorInfo) bool {
		return a.Name == b.Name && a.DType == b.DType && slices.Equal(a.Shape, b.Shape)
	}) || f.Metadata()["k"] != "v" {
		t.Fatalf("Tensors = %+v, Metadata = %v; the header says %+v", f.Tensors(), f.Metadata(), whole.Infos())
	}
	for _, info := range f.Tensors() {
		shape, _ := whole.Shape(info.Name)
		want, _ := whole.Tensor(info.Name, shape)
		for _, r := range [][2]int{{0, len(want)}, {len(want) / 3, len(want) - 1}, {len(want) - 1, len(want)}} {
			got := make([]float32, r[1]-r[0])
			if err := f.Read(info.Name, r[0], got); err != nil || !slices.Equal(got, want[r[0]:r[1]]) {
				t.Fatalf("%s [%d, %d): %v", info.Name, r[0], r[1], err)
			}
		}
	}
	if err := f.Read("full", 3, make([]float32, 2)); err == nil {
		t.Error("a range past the tensor's end was read")
	}
	if err := f.Read("absent", 0, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("an absent tensor: %v, want ErrNotFound", err)
	}
}

// A spooled download opens as the file it copied; one that ends early is
// ErrTruncated, and one larger than the limits allow is ErrTooLarge before
// a byte is copied.
func TestSpool(t *testing.T) {
	data, err := Encode([]Tensor{{Name: "w", Shape: []int{3}, Data: []float32{1, 2, 3}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Limits{}.Spool(bytes.NewReader(data), int64(len(data)), "http://example/w")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 3)
	if err := f.Read("w", 0, got); err != nil || !slices.Equal(got, []float32{1, 2, 3}) || f.Name() != "http://example/w" {
		t.Fatalf("Read = %v, %v (%s)", got, err, f.Name())
	}
	f.Close()
	if _, err := (Limits{}).Spool(bytes.NewReader(data[:len(data)-1]), int64(len(data)), "short"); !errors.Is(err, ErrTruncated) {
		t.Errorf("a short download: %v, want ErrTruncated", err)
	}
	r := &countingReader{r: bytes.NewReader(data)}
	if _, err := (Limits{MaxDataSize: 4, MaxHeaderSize: 16}).Spool(r, int64(len(data)), "big"); !errors.Is(err, ErrTooLarge) || r.n != 0 {
		t.Errorf("a download over the limits: %v after %d bytes, want ErrTooLarge before any", err, r.n)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
