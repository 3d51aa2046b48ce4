//go:build !linux

package torch

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// sysProcAttr: outside Linux there is no parent-death signal; Close and the
// node's Run end the worker.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func killTree(p *os.Process) { _ = p.Kill() }

// processStart: outside Linux no process's start time is read, so worker
// directories are never judged and a killed psyche's stays.
func processStart(int) (uint64, bool, error) { return 0, false, errors.ErrUnsupported }

func pidNamespace() string { return "-" }

func ownedByUs(fs.FileInfo) bool { return false }

// hostMemory: outside Linux the machine's RAM is not read (0: unknown).
func hostMemory() int64 { return 0 }
