package runmodel

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/psyche-go/psyche/trainer/checkpoint"
)

// TestHeaderValuesCannotClaimMoreThanTheFile: the values a safetensors
// header is counted to hold are bounded by the file: tensors that share
// bytes, overrun the data or do not fill their offsets are malformed, so a
// small file cannot vouch for a large config.
func TestHeaderValuesCannotClaimMoreThanTheFile(t *testing.T) {
	dir := t.TempDir()
	file := func(header string, data int) string {
		t.Helper()
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
		b = append(append(b, header...), make([]byte, data)...)
		path := filepath.Join(dir, "x.safetensors")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	n, err := headerValues(file(`{"__metadata__":{"a":"b"},"w":{"dtype":"F32","shape":[10,10],"data_offsets":[0,400]},"v":{"dtype":"BF16","shape":[4],"data_offsets":[400,408]}}`, 408))
	if err != nil || n != 104 {
		t.Fatalf("a good header: %d values, %v; want 104", n, err)
	}
	for name, tc := range map[string]struct {
		header string
		data   int
	}{
		"tensors sharing bytes":           {`{"w":{"dtype":"F32","shape":[100],"data_offsets":[0,400]},"v":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}}`, 400},
		"offsets past the data":           {`{"w":{"dtype":"F32","shape":[1000000],"data_offsets":[0,4000000]}}`, 400},
		"a shape larger than its offsets": {`{"w":{"dtype":"F32","shape":[1000000],"data_offsets":[0,400]}}`, 400},
		"a shape that overflows":          {`{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0},
		"an unknown dtype":                {`{"w":{"dtype":"I64","shape":[50],"data_offsets":[0,400]}}`, 400},
	} {
		if n, err := headerValues(file(tc.header, tc.data)); !errors.Is(err, checkpoint.ErrMalformed) {
			t.Errorf("%s: %d values, %v; want %v", name, n, err, checkpoint.ErrMalformed)
		}
	}
}
