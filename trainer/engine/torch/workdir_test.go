package torch

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// holdEnv makes the test binary a psyche that holds one torch engine
// (holdEngine) instead of running the tests.
const holdEnv = "PSYCHE_TORCH_TEST_HOLD"

func TestMain(m *testing.M) {
	if os.Getenv(holdEnv) != "" {
		os.Exit(holdEngine())
	}
	os.Exit(m.Run())
}

// holdEngine opens a torch engine, prints its worker's directory and
// process, then computes a gradient for each line it reads and says "ok"
// or the error; at the end of its input it closes the engine.
func holdEngine() int {
	ctx := context.Background()
	pm := parityModels[0]
	op, err := New()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	m, err := runmodel.New(pm.cfg, 3, nil)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	w, err := runmodel.HostWeights(m)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	e, err := op.Open(ctx, engine.Spec{Weights: w, Optimizer: runOptions(true)})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer e.Close()
	fmt.Println(e.(*eng).w.dir, e.(*eng).Pid())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		b := randomBatch(rand.New(rand.NewPCG(1, 1)), vocabOf(pm.cfg), 2, pm.cfg.Context())
		if _, err := e.Gradient(ctx, b); err != nil {
			fmt.Println(firstLine(err.Error()))
			continue
		}
		fmt.Println("ok")
	}
	return 0
}

// holder is a psyche holding a torch engine (holdEngine), in a process of
// its own.
type holder struct {
	cmd    *exec.Cmd
	in     *os.File
	out    *bufio.Scanner
	dir    string
	worker int
}

func startHolder(t *testing.T) *holder {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), holdEnv+"=1")
	cmd.Stdin = inR
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	h := &holder{cmd: cmd, in: inW, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		h.in.Close()
		h.cmd.Process.Kill()
		h.cmd.Wait()
	})
	line := h.line(t)
	if _, err := fmt.Sscan(line, &h.dir, &h.worker); err != nil {
		t.Fatalf("the holding psyche said %q, not its worker's directory and process", line)
	}
	return h
}

func (h *holder) line(t *testing.T) string {
	t.Helper()
	if !h.out.Scan() {
		t.Fatalf("the holding psyche ended without a word (%v)", h.out.Err())
	}
	return h.out.Text()
}

func exists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "worker.py"))
	return err == nil
}

// TestEndedWorkersDirectoriesRemoved: a psyche killed while it holds a
// torch engine leaves its worker's directory behind (the worker dies with
// it), and the next worker's start removes it, while the directory of a
// psyche that runs stays and its worker still computes. A directory whose
// owner's pid now belongs to a process started at another time is removed
// too; one in another pid namespace, or without an owner file (an older
// psyche's), stays.
func TestEndedWorkersDirectoriesRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // the holders' and this process's workers' folder, nobody else's
	killed, live := startHolder(t), startHolder(t)
	if !exists(killed.dir) || !exists(live.dir) || filepath.Dir(killed.dir) != tmp {
		t.Fatalf("the holders' directories %s and %s are not two workers' in %s", killed.dir, live.dir, tmp)
	}
	if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed.cmd.Wait()
	gone(t, killed.worker)
	if !exists(killed.dir) {
		t.Fatal("the killed psyche's worker directory is already gone: nothing left to clean")
	}
	me, ok := self()
	if !ok {
		t.Fatal("this process's start time cannot be read")
	}
	synthetic := func(name string, o *owner) string {
		dir := filepath.Join(tmp, dirPrefix+name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "worker.py"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if o != nil {
			if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(o.String()), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	reused := synthetic("reused", &owner{pid: me.pid, start: me.start + 1, ns: me.ns})
	elsewhere := synthetic("elsewhere", &owner{pid: killed.cmd.Process.Pid, start: 1, ns: "pid:[1]"})
	older := synthetic("older", nil)

	_, op := openers(t)
	e := open(t, op, parityModels[0].cfg, 3, runOptions(true))
	for _, tc := range []struct {
		name, dir string
		stays     bool
	}{
		{"the killed psyche's", killed.dir, false},
		{"a reused pid's", reused, false},
		{"the live psyche's", live.dir, true},
		{"another pid namespace's", elsewhere, true},
		{"an older psyche's, without an owner", older, true},
		{"the new worker's", e.(*eng).w.dir, true},
	} {
		if exists(tc.dir) != tc.stays {
			t.Errorf("%s directory: there %v, want %v", tc.name, exists(tc.dir), tc.stays)
		}
	}
	fmt.Fprintln(live.in)
	if got := live.line(t); got != "ok" {
		t.Errorf("the live psyche's worker, after the cleaning: %s", got)
	}
	live.in.Close()
	if err := live.cmd.Wait(); err != nil {
		t.Errorf("the live psyche: %v", err)
	}
	if exists(live.dir) {
		t.Error("the live psyche left its worker's directory at Close")
	}
}

// TestOwnerFile: an owner file reads back as written; what is not one is
// refused.
func TestOwnerFile(t *testing.T) {
	o := owner{pid: 4242, start: 987654321, ns: "pid:[4026531836]"}
	got, err := parseOwner([]byte(o.String()))
	if err != nil || got != o {
		t.Fatalf("%q read back as %+v, %v", o.String(), got, err)
	}
	for _, bad := range []string{"", "4242 987654321 pid:[1]", "4242 987654321\n", "4242 987654321 pid:[1] x\n", "-1 5 ns\n",
		"0 5 ns\n", "+4242 5 ns\n", "4242 -5 ns\n", "4242 05 ns\n", "4242 5  \n", "pid 5 ns\n", "4242 5 ns\n\n"} {
		if o, err := parseOwner([]byte(bad)); err == nil {
			t.Errorf("%q read as %+v", bad, o)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: a multi-line error %q", bad, err)
		}
	}
}

// FuzzOwnerFile: anything in a file named owner in a worker's directory
// is read without panicking, and what is read is written back the same.
func FuzzOwnerFile(f *testing.F) {
	f.Add([]byte("4242 987654321 pid:[4026531836]\n"))
	f.Add([]byte("1 0 -\n"))
	f.Add([]byte("4242 5 ns"))
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := parseOwner(b)
		if err != nil {
			return
		}
		if o.String() != string(b) {
			t.Fatalf("%q read as %+v, written back as %q", b, o, o.String())
		}
	})
}
