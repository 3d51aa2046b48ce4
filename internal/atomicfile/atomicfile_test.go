package atomicfile

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	errWrite := errors.New("disk full")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		perm    fs.FileMode
		write   func(io.Writer) error
		want    string // the file's content afterwards
		wantErr error
	}{
		{"replaces", context.Background(), 0o644, writeString("new"), "new", nil},
		{"private", context.Background(), 0o600, writeString("secret"), "secret", nil},
		{"a failed write keeps the old file", context.Background(), 0o644, func(w io.Writer) error {
			_, _ = io.WriteString(w, "half")
			return errWrite
		}, "old", errWrite},
		{"an ended context keeps the old file", cancelled, 0o644, writeString("late"), "old", context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			err := Write(tc.ctx, path, tc.perm, tc.write)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			got, _ := os.ReadFile(path)
			if string(got) != tc.want {
				t.Errorf("content %q, want %q", got, tc.want)
			}
			if st, _ := os.Stat(path); tc.wantErr == nil && st.Mode().Perm() != tc.perm {
				t.Errorf("mode %v, want %v", st.Mode().Perm(), tc.perm)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("%d files left in the directory, want 1", len(entries))
			}
		})
	}
}

func TestWriteFileCreates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new")
	if err := WriteFile(path, []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "x" {
		t.Errorf("content %q", got)
	}
	if err := WriteFile(filepath.Join(t.TempDir(), "no", "such", "dir"), nil, 0o644); err == nil {
		t.Error("a missing directory was accepted")
	}
}

func writeString(s string) func(io.Writer) error {
	return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
}
