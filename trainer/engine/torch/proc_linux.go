package torch

import (
	"os"
	"syscall"
)

// sysProcAttr puts the worker in a process group of its own (so killTree
// reaches what it starts: torch's compile workers) and has the kernel kill
// it when psyche dies, so no worker outlives its trainer.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killTree kills the worker's process group.
func killTree(p *os.Process) {
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	_ = p.Kill()
}
