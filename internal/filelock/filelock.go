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
	f *os.File
}

// TryLock takes the exclusive lock on path, creating the file (mode 0600)
// if needed, without waiting: if another process holds it, the error wraps
// ErrLocked and names the file and the holder's pid.
func TryLock(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		if errors.Is(err, errWouldBlock) {
			return nil, fmt.Errorf("%s is %w%s", path, ErrLocked, holder(path))
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	// The pid is written only once the lock is held, so it is never the
	// pid of a process that lost the race.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
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

// Unlock releases the lock. The file stays: removing it would let a third
// process lock a new file of the same name while a second still waits on
// the old one.
func (l *Lock) Unlock() error {
	return l.f.Close()
}
