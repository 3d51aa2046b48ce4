// Package atomicfile owns how the project replaces files on disk: through a
// temporary file in the same directory that is written, synced and renamed
// over the target, so that a crash at any point leaves either the old file
// or the complete new one, never a mix or a truncated file.
package atomicfile

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// Write replaces path with what write produces, with permissions perm.
// If write fails, or ctx ends before the rename, the temporary file is
// removed and path is left as it was.
func Write(ctx context.Context, path string, perm fs.FileMode, write func(w io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp, renamed := f.Name(), false
	defer func() {
		if !renamed {
			f.Close() // a second Close only reports an error nobody needs
			os.Remove(tmp)
		}
	}()
	// CreateTemp makes the file private (0600); give it the target's mode
	// before anyone can see it under the target's name.
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := write(f); err != nil {
		return err
	}
	// Sync before the rename: otherwise a crash could leave the new name
	// pointing at a file whose blocks never reached the disk.
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	// The last chance to back out: after the rename the new file is the
	// one on disk.
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	renamed = true
	syncDir(dir)
	return nil
}

// WriteFile replaces path with data (permissions perm).
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return Write(context.Background(), path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// syncDir makes a rename in dir durable. It is best effort: the rename is
// already atomic, some filesystems cannot sync a directory, and Windows
// cannot open one for syncing (it commits renames itself).
func syncDir(dir string) {
	if runtime.GOOS == "windows" {
		return
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
