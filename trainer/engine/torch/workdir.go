package torch

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// A worker's directory (its code and a multi-device worker's rendezvous
// file) is made in the system's temporary folder by the
// psyche that starts the worker, and removed by it when the worker ends.
// A psyche that is killed cannot remove it (its worker dies with it: the
// parent-death signal), so each directory names the psyche that made it
// in a file, and each worker's start removes the directories whose psyche
// has ended. A directory whose psyche runs stays whatever its worker does:
// that psyche removes it itself.
const (
	dirPrefix = "psyche-worker-"
	ownerFile = "owner"
)

// owner identifies a process across time: its pid, its start time (clock
// ticks after boot; a later process that reuses the pid started later)
// and its pid namespace (a pid names another process, or none, in another
// namespace: a container sharing the temporary folder).
type owner struct {
	pid   int
	start uint64
	ns    string // /proc/self/ns/pid's link, "pid:[4026531836]"; "-" where unknown
}

// String is the owner file's one line: "pid start namespace".
func (o owner) String() string { return fmt.Sprintf("%d %d %s\n", o.pid, o.start, o.ns) }

// parseOwner reads an owner file (written by this or another psyche, or
// anything else that made a file of that name).
func parseOwner(b []byte) (owner, error) {
	line, ok := strings.CutSuffix(string(b), "\n")
	fields := strings.Split(line, " ")
	if !ok || len(fields) != 3 || fields[2] == "" || strings.ContainsAny(fields[2], "\n\t") {
		return owner{}, errors.New("torch engine: an owner file is not one line of pid, start time and namespace")
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil || pid <= 0 || strconv.Itoa(pid) != fields[0] {
		return owner{}, fmt.Errorf("torch engine: owner pid %q is not a process id", fields[0])
	}
	start, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil || strconv.FormatUint(start, 10) != fields[1] {
		return owner{}, fmt.Errorf("torch engine: owner start time %q is not a number of clock ticks", fields[1])
	}
	return owner{pid: pid, start: start, ns: fields[2]}, nil
}

// self is this process as an owner (ok false where the system does not
// say when a process started: its directories are then never judged).
var self = sync.OnceValues(func() (owner, bool) {
	start, _, err := processStart(os.Getpid())
	if err != nil {
		return owner{}, false
	}
	return owner{pid: os.Getpid(), start: start, ns: pidNamespace()}, true
})

// ended reports whether o has ended: no process has its pid, or the one
// that has started at another time, or it is a zombie. An owner in another
// pid namespace, or one whose state cannot be read, has not ended as far as
// this process can tell.
func (o owner) ended(me owner) bool {
	if o.ns != me.ns {
		return false
	}
	start, zombie, err := processStart(o.pid)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	return err == nil && (start != o.start || zombie)
}

// makeWorkerDir removes the worker directories in the temporary folder
// whose psyche has ended, then makes this worker's and names this process
// its owner.
func makeWorkerDir(log *slog.Logger) (string, error) {
	me, known := self()
	if known {
		removeEnded(os.TempDir(), me, log)
	}
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return "", err
	}
	if known {
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(me.String()), 0o600); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// removeEnded removes the worker directories in tmp whose owner has ended.
// A directory without an owner file is left alone: it is being made right
// now, or an older psyche made it (which cannot be told from a live one).
// So is one of another user.
func removeEnded(tmp string, me owner, log *slog.Logger) {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		if info, err := e.Info(); err != nil || !ownedByUs(info) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		o, err := parseOwner(b)
		if err != nil || !o.ended(me) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("torch engine: cannot remove the directory of an ended worker", "dir", dir, "err", err)
			continue
		}
		log.Debug("torch engine: removed the directory of an ended worker", "dir", dir, "owner", o.pid)
	}
}
