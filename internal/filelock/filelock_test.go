package filelock

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// helperEnv, when set, makes this test binary a lock holder instead of a
// test run: TestHelperProcess takes the lock on the named file, says
// "locked" on stdout and waits to be killed.
const helperEnv = "FILELOCK_TEST_HOLD"

func TestHelperProcess(t *testing.T) {
	path := os.Getenv(helperEnv)
	if path == "" {
		t.Skip("only run as a helper process")
	}
	if _, err := TryLock(path); err != nil {
		os.Stdout.WriteString("error: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("locked\n")
	// Hold the lock until the parent kills this process (reading stdin
	// blocks until then; the parent never writes to it).
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(0)
}

// holdInProcess starts a separate process that takes the lock on path, and
// returns once it holds it.
func holdInProcess(t *testing.T, path string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if line != "locked\n" {
		t.Fatalf("helper process: %q %v", line, err)
	}
	return cmd
}

func TestSecondProcessIsRefusedUntilTheFirstDies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p2p.key.lock")
	first := holdInProcess(t, path)

	// This test's own process is the second one.
	_, err := TryLock(path)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second process got %v, want ErrLocked", err)
	}
	for _, want := range []string{path, "process " + strconv.Itoa(first.Process.Pid)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}

	// SIGKILL gives the holder no chance to clean up: the kernel releases
	// the lock when the process is gone.
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	l, err := TryLock(path)
	if err != nil {
		t.Fatalf("after the holder was killed: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q (%v), want this pid %d", b, err, os.Getpid())
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
}

// Two opens of the file in one process are two lock holders too, so one
// process cannot run two trainers on one key either.
func TestSecondLockInOneProcessIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.json.lock")
	l, err := TryLock(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := TryLock(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v, want ErrLocked", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	l, err = TryLock(path)
	if err != nil {
		t.Fatalf("after Unlock: %v", err)
	}
	_ = l.Unlock()
}

func TestUnwritableDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "x.lock")
	if _, err := TryLock(path); err == nil || errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), path) {
		t.Fatalf("got %v, want an error naming %s", err, path)
	}
}

func TestUnlockRemovesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.json.lock")
	l, err := TryLock(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lock file after Unlock: %v, want it gone", err)
	}
}

// TestRemovedFileIsNotTheLock: a file opened before its holder removed it
// (Unlock) is not the lock any more.
func TestRemovedFileIsNotTheLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.json.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !stillAt(f, path) {
		t.Fatal("a file just opened is not at its path")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if stillAt(f, path) {
		t.Fatal("a removed file is still taken for the one at its path")
	}
}

// TestOneHolderAtATime has goroutines (each lock its own open file, as
// separate processes have) take and release the lock in a loop and checks
// that no two ever hold it at once, with Unlock removing the file between.
func TestOneHolderAtATime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.json.lock")
	var holders, most, taken atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				l, err := TryLock(path)
				if err != nil {
					if !errors.Is(err, ErrLocked) {
						t.Error(err)
						return
					}
					continue
				}
				n := holders.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				taken.Add(1)
				holders.Add(-1)
				if err := l.Unlock(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if most.Load() != 1 || taken.Load() == 0 {
		t.Fatalf("at most %d holders at once (want 1), %d locks taken", most.Load(), taken.Load())
	}
}

// TestUnlockBetweenOpenAndLock: B opens the lock file, A unlocks (removing
// it), B locks what it opened. B must end up holding the lock on the file at
// path, so that C, coming after, is refused.
func TestUnlockBetweenOpenAndLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.json.lock")
	a, err := TryLock(path)
	if err != nil {
		t.Fatal(err)
	}
	beforeLock = func() {
		beforeLock = nil
		if err := a.Unlock(); err != nil {
			t.Error(err)
		}
	}
	defer func() { beforeLock = nil }()
	b, err := TryLock(path)
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	defer b.Unlock()
	if c, err := TryLock(path); !errors.Is(err, ErrLocked) {
		if c != nil {
			c.Unlock()
		}
		t.Fatalf("C while B holds the lock: %v, want ErrLocked", err)
	}
}
