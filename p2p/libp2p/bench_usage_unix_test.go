//go:build unix

package libp2p

import (
	"syscall"
	"time"
)

// resources is what the process has used so far: CPU time (user and
// system, all threads) and bytes of memory touched for the first time
// (minor page faults, at 4 KiB each).
type resources struct {
	cpu     time.Duration
	faulted int64
}

func usage() resources {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return resources{}
	}
	return resources{cpu: time.Duration(r.Utime.Nano() + r.Stime.Nano()), faulted: int64(r.Minflt) * 4096}
}
