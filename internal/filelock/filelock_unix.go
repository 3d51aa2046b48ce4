//go:build unix

package filelock

import (
	"os"
	"syscall"
)

var errWouldBlock error = syscall.EWOULDBLOCK

func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}
