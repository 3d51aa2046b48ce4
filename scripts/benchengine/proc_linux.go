package main

import (
	"os/exec"
	"syscall"
)

// dieWithUs has the kernel kill cmd when this process dies (a timeout that
// kills benchengine leaves no plain-torch process holding the device).
func dieWithUs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
