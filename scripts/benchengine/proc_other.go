//go:build !linux

package main

import "os/exec"

// dieWithUs does nothing where the kernel cannot kill a child with its
// parent.
func dieWithUs(*exec.Cmd) {}
