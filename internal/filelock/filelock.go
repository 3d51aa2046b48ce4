// Package filelock owns the project's advisory file locks: a process that
// must be the only user of a file (a trainer's identity key) holds an
// exclusive lock on a lock file beside it for as long as it runs.
//
// The lock is the operating system's (flock on Unix, LockFileEx on
// Windows), not the file's existence: the kernel releases it when the
// process exits however it exits, SIGKILL and crashes included, so a stale
// lock file never keeps the next run out. The file holds the holder's pid,
// only so that the error a second process gets can name it.
package filelock

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrLocked is returned (wrapped) by Lock when another process holds the lock.
var ErrLocked = errors.New("locked by another process")

// Lock is a held lock; Unlock releases it.
type Lock struct {
	f    *os.File
	path string
}

// TryLock takes the exclusive lock on path, creating the file (mode 0600)
// if needed, without waiting: if another process holds it, the error wraps
// ErrLocked and names the file and the holder's pid.
func TryLock(path string) (*Lock, error) {
	// Unlock removes the file while it still holds the lock, so a process
	// can lock a file that is no longer path's (it opened it before the
	// removal): then it tries again on the new one. Three tries cover any
	// interleaving short of a third process unlocking in between each time.
	for try := 0; ; try++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("lock file: %w", err)
		}
		if beforeLock != nil {
			beforeLock()
		}
		if err := lockFile(f); err != nil {
			f.Close()
			if errors.Is(err, errWouldBlock) {
				return nil, fmt.Errorf("%s is %w%s", path, ErrLocked, holder(path))
			}
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !stillAt(f, path) {
			f.Close()
			if try < 3 {
				continue
			}
			return nil, fmt.Errorf("%s is %w (it keeps being replaced)", path, ErrLocked)
		}
		// The pid is written only once the lock is held, so it is never the
		// pid of a process that lost the race.
		if err := f.Truncate(0); err == nil {
			_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		return &Lock{f: f, path: path}, nil
	}
}

// beforeLock, when set (by tests), runs between opening the lock file and
// locking it: where another process's Unlock can come between.
var beforeLock func()

// stillAt says whether f is the file now at path.
func stillAt(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// holder describes the pid recorded in the lock file at path (empty if it
// cannot be read: the holder may not have written it yet).
func holder(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" (process %d)", pid)
}

// Unlock releases the lock and removes the lock file, so none is left
// beside the key once its process is done. (A process killed without
// Unlock leaves the file, which locks nothing: the next TryLock takes it.)
// The file goes while the lock is still held: a process that opened it
// before finds, once it gets the lock, that the file is no longer path's
// and tries again on a fresh one (TryLock), so two processes never both
// hold "the" lock.
func (l *Lock) Unlock() error {
	_ = os.Remove(l.path) // best effort: Windows refuses to remove an open file
	return l.f.Close()
}
