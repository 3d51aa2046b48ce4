package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// These tests replace wrapFileWriter, so they must not run in parallel.

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// failingWriter passes through its first n bytes, then calls onFail and
// returns its error.
type failingWriter struct {
	w      io.Writer
	n      int
	onFail func() error
}

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(p) <= f.n {
		f.n -= len(p)
		return f.w.Write(p)
	}
	k, _ := f.w.Write(p[:f.n])
	f.n = 0
	return k, f.onFail()
}

func withWriterHook(t *testing.T, hook func(io.Writer) io.Writer) {
	old := wrapFileWriter
	wrapFileWriter = hook
	t.Cleanup(func() { wrapFileWriter = old })
}

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	r := rand.New(rand.NewPCG(7, 7))
	tensors := randomTensors(r, 30)
	meta := map[string]string{"step": "7"}
	if err := Save(t.Context(), path, tensors, meta); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sameTensors(t, c.Tensors(), tensors)
	if c.Metadata()["step"] != "7" {
		t.Fatalf("metadata %v", c.Metadata())
	}
	// Saving what was loaded gives the same bytes.
	first, _ := os.ReadFile(path)
	path2 := filepath.Join(dir, "again.safetensors")
	if err := Save(t.Context(), path2, c.Tensors(), c.Metadata()); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(path2)
	if !bytes.Equal(first, second) {
		t.Fatal("re-saving a loaded checkpoint changed its bytes")
	}
	if enc, _ := Encode(tensors, meta); !bytes.Equal(enc, first) {
		t.Fatal("Save and Encode disagree")
	}
	if runtime.GOOS != "windows" {
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
			t.Fatalf("new file mode %v, want 0644", fi.Mode().Perm())
		}
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"again.safetensors", "model.safetensors"}) {
		t.Fatalf("directory holds %v", names)
	}
}

func TestSaveReplacesAndKeepsMode(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix permission bits")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Save(t.Context(), path, []Tensor{{Name: "a", Data: []float32{1}}}, nil); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want the replaced file's 0600", fi.Mode().Perm())
	}
	if _, err := Load(path); err != nil {
		t.Fatal(err)
	}
}

// saveOld writes a first checkpoint and returns its bytes.
func saveOld(t *testing.T, path string) []byte {
	t.Helper()
	if err := Save(t.Context(), path, []Tensor{{Name: "old", Shape: []int{3}, Data: []float32{1, 2, 3}}}, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// bigTensors is larger than the write buffer, so a save makes several writes
// to the file and checks its context several times.
func bigTensors() []Tensor {
	return []Tensor{{Name: "big", Shape: []int{3, 1 << 18}, Data: make([]float32, 3<<18)}}
}

// checkUntouched asserts that a failed save left path with its old bytes and
// no temporary file behind.
func checkUntouched(t *testing.T, dir, path string, old []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, old) {
		t.Fatalf("old checkpoint changed (err %v)", err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{filepath.Base(path)}) {
		t.Fatalf("directory holds %v, want only the old checkpoint", names)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("old checkpoint no longer loads: %v", err)
	}
}

func TestSaveFailureMidWrite(t *testing.T) {
	for _, failAt := range []int{0, 5, 100, 1 << 20, 3<<20 - 1} {
		t.Run(strconv.Itoa(failAt), func(t *testing.T) { saveFailingAt(t, failAt) })
	}
}

func saveFailingAt(t *testing.T, failAt int) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	old := saveOld(t, path)
	diskFull := errors.New("no space left on device")
	withWriterHook(t, func(w io.Writer) io.Writer {
		return &failingWriter{w: w, n: failAt, onFail: func() error { return diskFull }}
	})
	err := Save(t.Context(), path, bigTensors(), nil)
	if !errors.Is(err, diskFull) || !strings.HasPrefix(err.Error(), "checkpoint: save ") {
		t.Fatalf("Save = %v", err)
	}
	checkUntouched(t, dir, path, old)
}

func TestSaveCancelledMidWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	old := saveOld(t, path)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	writes := 0
	withWriterHook(t, func(w io.Writer) io.Writer {
		return writerFunc(func(p []byte) (int, error) {
			if writes++; writes == 1 {
				cancel() // the first buffer flush cancels; the next chunk must notice
			}
			return w.Write(p)
		})
	})
	err := Save(ctx, path, bigTensors(), nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Save = %v, want context.Canceled", err)
	}
	if writes != 1 {
		t.Fatalf("Save went on writing %d times after cancellation", writes)
	}
	checkUntouched(t, dir, path, old)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestSaveCancelledBefore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	old := saveOld(t, path)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := Save(ctx, path, bigTensors(), nil); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "checkpoint: ") {
		t.Fatalf("Save = %v", err)
	}
	checkUntouched(t, dir, path, old)
	var buf bytes.Buffer
	if n, err := Write(ctx, &buf, bigTensors(), nil); !errors.Is(err, context.Canceled) || n != 0 {
		t.Fatalf("Write = %d, %v", n, err)
	}
}

func TestSaveInvalidLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	old := saveOld(t, path)
	err := Save(t.Context(), path, []Tensor{{Name: "a", Shape: []int{2}, Data: []float32{1}}}, nil)
	if !errors.Is(err, ErrInvalidTensor) {
		t.Fatalf("Save = %v", err)
	}
	checkUntouched(t, dir, path, old)
}

// TestSaveRenameFails fails at the last step, after the temporary file is
// complete: the target is a directory, which a file cannot replace.
func TestSaveRenameFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Save(t.Context(), path, bigTensors(), nil); err == nil {
		t.Fatal("Save replaced a directory")
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"m.safetensors"}) {
		t.Fatalf("directory holds %v", names)
	}
}

func TestSaveReadOnlyDirectory(t *testing.T) {
	if runtime.GOOS == "windows" || os.Geteuid() == 0 {
		t.Skip("needs Unix permissions that apply to this user (root ignores them)")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	old := saveOld(t, path)
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	if err := Save(t.Context(), path, bigTensors(), nil); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("Save in a read-only directory = %v", err)
	}
	checkUntouched(t, dir, path, old)
}

func TestSaveMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "m.safetensors")
	if err := Save(t.Context(), path, nil, nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Save = %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(err.Error(), "checkpoint: ") {
		t.Fatalf("Load(missing) = %v", err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("Load(dir) = %v", err)
	}
	path := filepath.Join(dir, "m.safetensors")
	enc, _ := Encode([]Tensor{{Name: "a", Shape: []int{4}, Data: []float32{1, 2, 3, 4}}}, nil)
	if err := os.WriteFile(path, enc[:len(enc)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load(truncated) = %v", err)
	}
	if _, err := (Limits{MaxHeaderSize: 8}).Load(path); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Load with a small header cap = %v", err)
	}
}

// TestLoadHeader: the tensors a file holds, by name, read from its header
// alone, as Load validates it.
func TestLoadHeader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	tensors := []Tensor{{Name: "z", Shape: []int{2, 3}, Data: make([]float32, 6)}, {Name: "a", Shape: []int{4}, Data: make([]float32, 4), DType: "BF16"}}
	if err := Save(context.Background(), path, tensors, nil); err != nil {
		t.Fatal(err)
	}
	infos, err := Limits{}.LoadHeader(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != "a" || infos[0].DType != "BF16" || !slices.Equal(infos[1].Shape, []int{2, 3}) || infos[1].DType != "F32" {
		t.Fatalf("LoadHeader = %+v", infos)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (Limits{}).LoadHeader(path); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a file one byte short: %v", err)
	}
}
