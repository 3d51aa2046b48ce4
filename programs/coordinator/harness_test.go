package coordinator_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	coord "github.com/psyche-go/psyche/coordinator"
)

// The host harness is every src/*.c but the SBPF entrypoint (the program's
// state machine, hashing and input parser: the very files the SBPF build
// compiles) with src/host/shim.c standing in for the syscalls and
// src/host/harness.c reading requests from stdin.

// harnessSources lists them; a file added to src/ joins both builds.
func harnessSources() ([]string, error) {
	all, err := filepath.Glob("src/*.c")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range all {
		if f != filepath.Join("src", "entrypoint.c") {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no C sources in src/")
	}
	return append(out, "src/host/shim.c", "src/host/harness.c"), nil
}

var (
	harnessOnce sync.Once
	harnessPath string
	harnessErr  error
	harnessDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if harnessDir != "" {
		os.RemoveAll(harnessDir)
	}
	os.Exit(code)
}

// compilers lists the C compilers to try, $CC first.
func compilers() []string {
	var out []string
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc", "clang", "clang-22"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// buildHarness compiles the harness once per test binary, with the address
// and undefined-behaviour sanitizers where the compiler has them (so a read
// past the account or the instruction data aborts the harness), else without.
func buildHarness(t *testing.T) string {
	t.Helper()
	harnessOnce.Do(func() {
		ccs := compilers()
		if len(ccs) == 0 {
			harnessErr = errSkip
			return
		}
		harnessDir, harnessErr = os.MkdirTemp("", "psyche-harness")
		if harnessErr != nil {
			return
		}
		out := filepath.Join(harnessDir, "harness")
		base := []string{"-DPSY_HOST", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-o", out}
		srcs, err := harnessSources()
		if err != nil {
			harnessErr = err
			return
		}
		base = append(base, srcs...)
		var logs bytes.Buffer
		for _, cc := range ccs {
			for _, extra := range [][]string{{"-fsanitize=address,undefined", "-fno-sanitize-recover=all"}, nil} {
				cmd := exec.Command(cc, append(extra, base...)...)
				cmd.Stdout, cmd.Stderr = &logs, &logs
				if err := cmd.Run(); err == nil {
					harnessPath = out
					if extra == nil {
						fmt.Fprintf(os.Stderr, "harness: built with %s without sanitizers\n", cc)
					}
					return
				}
			}
		}
		harnessErr = fmt.Errorf("no compiler could build the harness:\n%s", logs.String())
	})
	if errors.Is(harnessErr, errSkip) {
		t.Skip("no C compiler (cc, gcc, clang or $CC): the host build of the C program cannot be tested")
	}
	if harnessErr != nil {
		t.Fatal(harnessErr)
	}
	return harnessPath
}

var errSkip = errors.New("skip")

// harness is one running harness process.
type harness struct {
	cmd    *exec.Cmd
	in     *bufio.Writer
	out    *bufio.Reader
	stdin  io.WriteCloser
	stderr bytes.Buffer
}

func startHarness(t *testing.T) *harness {
	path := buildHarness(t)
	h := &harness{cmd: exec.Command(path)}
	h.cmd.Stderr = &h.stderr
	stdin, err := h.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.stdin = stdin
	h.in = bufio.NewWriterSize(stdin, 1<<18)
	h.out = bufio.NewReaderSize(stdout, 1<<18)
	t.Cleanup(func() {
		h.stdin.Close()
		h.cmd.Wait()
	})
	return h
}

// result is what one instruction did on either side.
type result struct {
	code uint32 // 0: accepted
	acct []byte // the account after the instruction
}

// run sends one request and reads the answer.
func (h *harness) run(t *testing.T, acct, data []byte, ctx coord.Context) (result, uint64) {
	t.Helper()
	u64 := func(v uint64) { binary.Write(h.in, binary.LittleEndian, v) }
	u64(uint64(len(acct)))
	h.in.Write(acct)
	u64(uint64(len(data)))
	h.in.Write(data)
	h.in.Write(ctx.Sender[:])
	h.in.Write(ctx.CoSigner[:])
	u64(ctx.Now)
	u64(ctx.Seed)
	if err := h.in.Flush(); err != nil {
		t.Fatalf("harness: %v\n%s", err, h.stderr.String())
	}
	var hdr [3]uint64
	if err := binary.Read(h.out, binary.LittleEndian, &hdr); err != nil {
		t.Fatalf("harness died: %v\n%s", err, h.stderr.String())
	}
	if hdr[2] != uint64(len(acct)) {
		t.Fatalf("harness returned %d account bytes, sent %d", hdr[2], len(acct))
	}
	out := make([]byte, hdr[2])
	if _, err := io.ReadFull(h.out, out); err != nil {
		t.Fatalf("harness died: %v\n%s", err, h.stderr.String())
	}
	return result{code: uint32(hdr[0]), acct: out}, hdr[1]
}

// goRun is the reference: the Go coordinator applied to account bytes the
// way the program applies an instruction: decode the instruction, then the
// account (a fresh all-zero account only for init_coordinator), then Apply.
func goRun(acct, data []byte, ctx coord.Context) result {
	fail := func(err error) result { return result{code: coord.CodeOf(err), acct: acct} }
	ix, err := coord.DecodeInstruction(data)
	if err != nil {
		return fail(err)
	}
	if len(acct) != coord.AccountSize {
		return fail(coord.ErrWrongSize)
	}
	var s *coord.Coordinator
	if _, isInit := ix.(*coord.InitCoordinator); isInit && bytes.Equal(acct[:8], make([]byte, 8)) {
		s = new(coord.Coordinator)
	} else if s, err = coord.DecodeAccount(acct); err != nil {
		return fail(err)
	}
	if _, err := s.Apply(ctx, ix); err != nil {
		return fail(err)
	}
	return result{acct: s.MarshalAccount()}
}

// diff compares both sides and describes the first difference.
func diff(goRes, cRes result) string {
	if goRes.code != cRes.code {
		return fmt.Sprintf("Go returned %s, C returned %s", codeName(goRes.code), codeName(cRes.code))
	}
	if !bytes.Equal(goRes.acct, cRes.acct) {
		for i := range goRes.acct {
			if goRes.acct[i] != cRes.acct[i] {
				return fmt.Sprintf("account bytes differ first at offset %d (%s): Go %#02x, C %#02x",
					i, fieldAt(i), goRes.acct[i], cRes.acct[i])
			}
		}
	}
	return ""
}

func codeName(c uint32) string {
	if c == 0 {
		return "ok"
	}
	if e := coord.ErrorFromCode(c); e != nil {
		return fmt.Sprintf("%d %s", c, e.Name)
	}
	return fmt.Sprintf("%d (unknown)", c)
}

// fieldAt names the account field at a byte offset, from the layout table.
func fieldAt(off int) string {
	rows, err := coord.LayoutTable()
	if err != nil {
		return "?"
	}
	best := "?"
	for _, f := range rows {
		if f.Count > 1 {
			if off >= f.Offset && off < f.Offset+f.Size*f.Count {
				best = fmt.Sprintf("%s[%d]+%d", f.Name, (off-f.Offset)/f.Size, (off-f.Offset)%f.Size)
			}
			continue
		}
		if off >= f.Offset && off < f.Offset+f.Size {
			best = f.Name
		}
	}
	return best
}
