package torch

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
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

// processStart is when process pid started, in clock ticks after boot
// (/proc/pid/stat's 22nd field), and whether it has ended unreaped (a
// zombie). An error wrapping os.ErrNotExist: there is no such process.
func processStart(pid int) (start uint64, zombie bool, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, err
	}
	// The command name (field 2, in parentheses) may hold spaces and
	// parentheses itself: the fields that follow start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false, fmt.Errorf("torch engine: /proc/%d/stat has no command name", pid)
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 20 {
		return 0, false, fmt.Errorf("torch engine: /proc/%d/stat has %d fields after the name", pid, len(fields))
	}
	start, err = strconv.ParseUint(string(fields[19]), 10, 64) // field 22; fields[0] is field 3, the state
	if err != nil {
		return 0, false, fmt.Errorf("torch engine: /proc/%d/stat: start time %q", pid, fields[19])
	}
	state := string(fields[0])
	return start, state == "Z" || state == "X", nil
}

// pidNamespace names this process's pid namespace ("-" if unknown).
func pidNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil || ns == "" {
		return "-"
	}
	return ns
}

// ownedByUs reports whether this process's user owns a file.
func ownedByUs(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}

// hostMemory is the machine's RAM in bytes (/proc/meminfo's MemTotal; 0 if
// unknown).
func hostMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}
