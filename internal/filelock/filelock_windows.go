//go:build windows

package filelock

import (
	"os"

	"golang.org/x/sys/windows"
)

var errWouldBlock error = windows.ERROR_LOCK_VIOLATION

// lockFile locks the file's first byte range far beyond its content, so that
// the lock (mandatory on Windows) never stops others reading the pid.
func lockFile(f *os.File) error {
	ol := &windows.Overlapped{Offset: ^uint32(0), OffsetHigh: ^uint32(0)}
	return windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
}
