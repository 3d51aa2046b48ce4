//go:build !linux

package torch

import (
	"os"
	"syscall"
)

// sysProcAttr: outside Linux there is no parent-death signal; Close and the
// node's Run end the worker.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func killTree(p *os.Process) { _ = p.Kill() }
