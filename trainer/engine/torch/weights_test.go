package torch

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// weightsMatchModel fails unless the engine's Weights, read from the worker
// a range at a time, hash and save (in each form a node writes) as the
// Model copied out whole does, reading a piece at a time, and unless the
// worker refuses a read outside a tensor and then goes on.
func weightsMatchModel(t *testing.T, e engine.Engine) {
	t.Helper()
	ctx := context.Background()
	m, err := e.(*eng).Model(ctx) // every tensor in one answer: not through Weights
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.Weights()
	if err != nil {
		t.Fatal(err)
	}
	largest, read := 0, w.Read
	w.Read = func(ctx context.Context, i, off int, dst []float32) error {
		largest = max(largest, len(dst))
		return read(ctx, i, off, dst)
	}
	if rev, err := w.Revision(ctx); err != nil || rev != runmodel.Revision(m) {
		t.Fatalf("the weights read from the worker hash to %s (%v), the model copied out to %s", rev, err, runmodel.Revision(m))
	}
	for _, hf := range []bool{false, true} {
		dir := t.TempDir()
		meta := map[string]string{"run": "r", "step": "2"}
		if err := runmodel.SaveWeights(ctx, w, filepath.Join(dir, "weights"), hf, meta); err != nil {
			t.Fatalf("hf %v: saving the weights: %v", hf, err)
		}
		if err := runmodel.Save(ctx, m, filepath.Join(dir, "model"), hf, meta); err != nil {
			t.Fatal(err)
		}
		sameTree(t, filepath.Join(dir, "model"), filepath.Join(dir, "weights"))
	}
	// A read is a piece of a checkpoint (a chunk at most), never the model.
	if largest >= m.NumParams()/2 {
		t.Fatalf("a read of %d values; the model has %d", largest, m.NumParams())
	}
	last := len(w.Shapes) - 1
	n := modelspec.Size(w.Shapes[last])
	for _, bad := range []struct{ i, off, n int }{{last + 1, 0, 1}, {last, n - 1, 2}, {-1, 0, 1}} {
		if err := w.Read(ctx, bad.i, bad.off, make([]float32, bad.n)); err == nil {
			t.Fatalf("a read of values [%d, %d) of tensor %d was answered", bad.off, bad.off+bad.n, bad.i)
		}
	}
	if again, err := w.Revision(ctx); err != nil || again != runmodel.Revision(m) {
		t.Fatalf("after refused reads: %s, %v", again, err)
	}
}

// sameTree fails unless the two paths (files or directories) hold the same
// files with the same bytes.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	err := filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		x, _ := os.ReadFile(p)
		y, err := os.ReadFile(filepath.Join(b, rel))
		if err != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s: the weights' file differs from the model's (%v)", rel, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
