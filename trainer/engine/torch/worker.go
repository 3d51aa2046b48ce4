package torch

import (
	"bufio"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The worker's code ships in the binary, so the psyche that starts a worker
// and the worker always speak the same protocol. It is written to a fresh
// directory at each start (makeWorkerDir) and removed when the worker ends.
//
//go:embed worker/*.py worker/protocol.json
var workerFiles embed.FS

// stderrLines is how many of the worker's last stderr lines an error
// quotes.
const stderrLines = 12

// worker is one running worker process and its two pipes.
type worker struct {
	cmd    *exec.Cmd
	python string
	dir    string
	req    *os.File // our end of its fd 3
	ans    *bufio.Reader
	ansF   *os.File   // our end of its fd 4
	readMu sync.Mutex // held while ans is read: a call's, or deadError's last look
	tail   *tail
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's answer, once exited is closed
	log    *slog.Logger
	// A multi-device worker's ranks, from its hello: their processes
	// (rank 0's first) and devices.
	pids    []int
	devices []string
	// progress is how many collectives each rank had entered when the
	// worker last said (its progress messages; nil: none yet).
	progress atomic.Pointer[[]uint64]
}

// pythons lists the interpreters to try, in order: PSYCHE_PYTHON (or the
// option) alone when set; otherwise the environment scripts/setup-torch
// installs (SetupPython), python3 on PATH and Debian's /usr/bin/python3.
func pythons(explicit string) []string {
	if explicit != "" {
		return []string{explicit}
	}
	if p := os.Getenv("PSYCHE_PYTHON"); p != "" {
		return []string{p}
	}
	out := []string{}
	seen := map[string]bool{}
	cands := []string{"python3", "/usr/bin/python3"}
	if p := SetupPython(); p != "" {
		cands = append([]string{p}, cands...)
	}
	for _, c := range cands {
		p, err := exec.LookPath(c)
		if err != nil {
			continue
		}
		// A virtual environment's python is a link to its base
		// interpreter, and yet another python: what it imports differs.
		// Only the same path twice is the same candidate.
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// SetupPython is the python of the environment scripts/setup-torch installs,
// or "" when there is none: $PSYCHE_TORCH_ENV, else
// $XDG_DATA_HOME/psyche/torch-env, else ~/.local/share/psyche/torch-env
// (the script's rule), once the script has finished there.
func SetupPython() string {
	env := os.Getenv("PSYCHE_TORCH_ENV")
	if env == "" {
		data := os.Getenv("XDG_DATA_HOME")
		if data == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return ""
			}
			data = filepath.Join(home, ".local", "share")
		}
		env = filepath.Join(data, "psyche", "torch-env")
	}
	// The script copies the requirements it installed last: without that
	// copy the install did not finish.
	if _, err := os.Stat(filepath.Join(env, "psyche-requirements.txt")); err != nil {
		return ""
	}
	p := filepath.Join(env, "bin", "python3")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// install says how to get a python the worker runs under.
var install = "run bash scripts/setup-torch (it installs the pinned torch " + MinTorch + "+ environment psyche finds by itself), or set PSYCHE_PYTHON to a python with torch " + MinTorch + " or newer and numpy"

// ErrNoTorch means no python could import torch and numpy: the worker cannot
// run on this machine as it is.
var ErrNoTorch = errors.New("torch engine: no python with torch " + MinTorch + " or newer and numpy")

// startWorker starts a worker under the first python that imports torch
// (MinTorch or newer) and numpy, and reads its hello.
func startWorker(ctx context.Context, o *options, timeout time.Duration) (*worker, *hello, error) {
	cands := pythons(o.python)
	if len(cands) == 0 {
		return nil, nil, fmt.Errorf("%w: no python3 on PATH; %s", ErrNoTorch, install)
	}
	var missing []string
	for _, py := range cands {
		w, h, err := startOne(ctx, o, py, timeout)
		if err == nil {
			return w, h, nil
		}
		var m *missingError
		if !errors.As(err, &m) {
			return nil, nil, err
		}
		if m.oldTorch != "" {
			missing = append(missing, fmt.Sprintf("%s has torch %s, older than %s", py, m.oldTorch, MinTorch))
			continue
		}
		missing = append(missing, fmt.Sprintf("%s lacks %s", py, strings.Join(m.modules, " and ")))
	}
	return nil, nil, fmt.Errorf("%w (%s): %s", ErrNoTorch, strings.Join(missing, "; "), install)
}

// missingError: the python lacks modules, or has a torch older than
// MinTorch.
type missingError struct {
	modules  []string
	oldTorch string
}

func (e *missingError) Error() string {
	return "missing python modules " + strings.Join(e.modules, ", ")
}

func startOne(ctx context.Context, o *options, python string, timeout time.Duration) (*worker, *hello, error) {
	dir, err := makeWorkerDir(o.log)
	if err != nil {
		return nil, nil, err
	}
	if err := writeWorker(dir); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	ansR, ansW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	cmd := exec.Command(python, "-u", filepath.Join(dir, "worker.py"))
	cmd.ExtraFiles = []*os.File{reqR, ansW} // fds 3 and 4
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if env, ok := inductorCacheEnv(); ok {
		cmd.Env = append(cmd.Env, env)
	}
	cmd.SysProcAttr = sysProcAttr()
	t := newTail(stderrLines, o.log)
	cmd.Stdout = t
	cmd.Stderr = t
	if err := cmd.Start(); err != nil {
		reqR.Close()
		reqW.Close()
		ansR.Close()
		ansW.Close()
		os.RemoveAll(dir)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("%w: %s cannot be started (%v); %s", ErrNoTorch, python, err, install)
		}
		return nil, nil, fmt.Errorf("torch engine: starting %s: %w", python, err)
	}
	reqR.Close()
	ansW.Close()
	w := &worker{cmd: cmd, python: python, dir: dir, req: reqW, ansF: ansR, ans: bufio.NewReaderSize(ansR, 1<<20), tail: t,
		exited: make(chan struct{}), log: o.log}
	go func() {
		w.err = cmd.Wait()
		t.flush()
		close(w.exited)
	}()
	h, err := w.hello(ctx, o, timeout)
	if err != nil {
		w.kill()
		var we *workerError
		switch {
		case errors.As(err, &we) && we.kind == kindMissing:
			return nil, nil, missingFrom(we)
		case errors.Is(err, errWorker):
			// It ended before saying hello: not a python that runs the
			// worker at all.
			return nil, nil, fmt.Errorf("%w: %s did not run the worker (%s%s); %s",
				ErrNoTorch, python, w.howExited(), w.tail.last(), install)
		}
		return nil, nil, err
	}
	return w, h, nil
}

// writeWorker writes the embedded worker into dir.
func writeWorker(dir string) error {
	entries, err := workerFiles.ReadDir("worker")
	if err != nil {
		return err
	}
	for _, e := range entries {
		b, err := workerFiles.ReadFile("worker/" + e.Name())
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// hello is what the worker says of itself.
type hello struct {
	Protocol   int    `json:"protocol"`
	Torch      string `json:"torch"`
	Numpy      string `json:"numpy"`
	Python     string `json:"python"`
	Device     string `json:"device"`
	DeviceName string `json:"device_name"`
	Memory     int64  `json:"memory"` // the device's memory in bytes (0: unknown, the CPU)
	SDPA       bool   `json:"sdpa"`
	Compile    bool   `json:"compile"` // torch.compile exists
	BF16       bool   `json:"bf16"`    // the device computes in bfloat16
	// A multi-device worker's: one device and one process per rank.
	Devices []string `json:"devices"`
	Pids    []int    `json:"pids"`
}

func (w *worker) hello(ctx context.Context, o *options, timeout time.Duration) (*hello, error) {
	// Importing torch takes seconds on a loaded machine, and a CUDA
	// torch initialises its device: a minute is ample, two when the
	// worker starts a process per device and they meet.
	req := &helloRequest{op: op{Op: opHello}, Protocol: protocolVersion, Device: o.device}
	wait := time.Minute
	if len(o.devices) > 0 {
		req.Devices = o.devices
		wait = 2 * time.Minute
	}
	if timeout > 0 {
		// The ranks' collectives time out with the round: a rank that
		// hangs cannot hold the others longer.
		req.Timeout = timeout.Seconds()
	}
	a, err := w.call(ctx, wait, req, nil, tensorBlobs{})
	if err != nil {
		return nil, err
	}
	var h hello
	if err := a.fields(&h); err != nil {
		return nil, err
	}
	if h.Protocol != protocolVersion {
		return nil, fmt.Errorf("torch engine: the worker speaks protocol %d, this psyche %d", h.Protocol, protocolVersion)
	}
	w.pids, w.devices = h.Pids, h.Devices
	return &h, nil
}

// errWorker wraps every failure of the worker process itself (it died, hung
// or broke the protocol): the engine is unusable after one.
var errWorker = errors.New("torch engine: the worker failed")

// call sends one request and waits for its answer, at most timeout (and
// while ctx lasts). A worker that does not answer in time is killed: its
// state is unknown, and a worker left computing holds the device.
func (w *worker) call(ctx context.Context, timeout time.Duration, req request, blobs [][]byte, tensors tensorBlobs) (*answer, error) {
	op := req.header().Op
	select {
	case <-w.exited:
		return nil, w.deadError(op)
	default:
	}
	type result struct {
		a   *answer
		err error
	}
	done := make(chan result, 1)
	go func() {
		if err := writeMessage(w.req, req, blobs, tensors); err != nil {
			done <- result{err: err}
			return
		}
		w.readMu.Lock()
		a, err := w.readAnswer()
		w.readMu.Unlock()
		done <- result{a, err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			w.kill()
			return nil, w.deadError(op)
		}
		if !r.a.OK && r.a.Kind == kindRank {
			return nil, w.rankError(op, r.a.Error)
		}
		if !r.a.OK {
			return nil, &workerError{op: op, kind: r.a.Kind, msg: r.a.Error, raw: r.a.Raw}
		}
		return r.a, nil
	case <-timer.C:
		behind := w.behind()
		w.kill()
		return nil, fmt.Errorf("%w: no answer to %s within %v (%s); killed it%s", errWorker, op, timeout, behind, w.tail.quote())
	case <-ctx.Done():
		w.kill()
		return nil, fmt.Errorf("%w: %s interrupted (%w); killed it", errWorker, op, ctx.Err())
	}
}

// deadError says why the worker is gone: what a multi-device worker said
// of a rank as its last message (unread when no request was in flight),
// else its exit status; and its last stderr lines.
func (w *worker) deadError(op opName) error {
	w.waitExit()
	// A call that timed out may still be reading (until the pipe's end):
	// what it reads is lost, as is the call.
	if w.readMu.TryLock() {
		a, err := w.readAnswer()
		w.readMu.Unlock()
		if err == nil && !a.OK && a.Kind == kindRank {
			return w.rankError(op, a.Error)
		}
	}
	return fmt.Errorf("%w: it stopped during %s (%s)%s", errWorker, op, w.howExited(), w.tail.quote())
}

// rankError is the end of a multi-device worker that stopped itself when a
// rank stopped or a collective failed, saying why (kindRank): that is the
// reason, whatever the exit status.
func (w *worker) rankError(op opName, why string) error {
	w.waitExit()
	return fmt.Errorf("%w: %s, during %s (the worker %s)%s", errWorker, why, op, w.howExited(), w.tail.quote())
}

// waitExit waits for the worker's exit: moments for one that is ending,
// and one that is not is killed.
func (w *worker) waitExit() {
	select {
	case <-w.exited:
	case <-time.After(5 * time.Second):
		w.kill()
		<-w.exited
	}
}

// readAnswer reads the next answer, taking the progress messages before
// it (the caller holds readMu).
func (w *worker) readAnswer() (*answer, error) {
	for {
		a, err := readMessage(w.ans)
		if err != nil || a.Progress == nil {
			return a, err
		}
		counts := a.Progress
		w.progress.Store(&counts)
	}
}

// behind says which rank of a worker that did not answer in time fell
// behind the others: each rank counts the collectives it enters, and the
// worker says the counts whenever they change (ranks.py); the ranks enter
// the same ones in the same order, so the ranks with the lowest count are
// those the others wait for. One device: "it hangs".
func (w *worker) behind() string {
	p := w.progress.Load()
	if len(w.devices) < 2 || p == nil || len(*p) != len(w.devices) {
		return "it hangs"
	}
	counts := *p
	low, high := uint64(math.MaxUint64), uint64(0)
	for _, n := range counts {
		low, high = min(low, n), max(high, n)
	}
	if low == high {
		return fmt.Sprintf("all %d ranks hang or compute", len(counts))
	}
	var late []string
	for r, n := range counts {
		if n == low {
			late = append(late, fmt.Sprintf("rank %d (%s)", r, w.devices[r]))
		}
	}
	return fmt.Sprintf("%s hangs: the other ranks wait for it in a collective", strings.Join(late, ", "))
}

// howExited is the worker's exit as Wait reported it.
func (w *worker) howExited() string {
	<-w.exited
	if w.err == nil {
		return "exit status 0"
	}
	return w.err.Error()
}

// Pid is the worker process's id.
func (w *worker) pid() int { return w.cmd.Process.Pid }

// kill ends the worker and everything it started, at once.
func (w *worker) kill() {
	select {
	case <-w.exited:
	default:
		killTree(w.cmd.Process)
	}
	w.cleanup()
}

// close asks the worker to exit (it does at the end of its requests) and
// kills it if it has not within a few seconds.
func (w *worker) close() error {
	w.req.Close()
	select {
	case <-w.exited:
	case <-time.After(10 * time.Second):
		killTree(w.cmd.Process)
		<-w.exited
	}
	// Now, not in cleanup's goroutine: a psyche that exits right after
	// Close would leave the directory behind.
	w.release()
	return nil
}

// cleanup releases the worker's pipe and directory once it has exited.
func (w *worker) cleanup() {
	go func() {
		<-w.exited
		w.release()
	}()
}

func (w *worker) release() {
	w.ansF.Close()
	os.RemoveAll(w.dir)
}

// workerError is the worker's own refusal of a request: the worker lives
// on (a batch too large for the device, a gradient that is not finite).
type workerError struct {
	op   opName
	kind errorKind
	msg  string
	raw  json.RawMessage // the answer's header, for a kind's own fields
}

func (e *workerError) Error() string {
	return fmt.Sprintf("torch engine: %s: %s", e.op, e.msg)
}

// tail keeps the last lines a worker wrote to stdout and stderr and logs
// each at debug level (the worker's own start line at info).
type tail struct {
	mu    sync.Mutex
	n     int
	lines []string
	part  []byte
	log   *slog.Logger
}

func newTail(n int, log *slog.Logger) *tail { return &tail{n: n, log: log} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.part = append(t.part, p...)
	for {
		i := strings.IndexByte(string(t.part), '\n')
		if i < 0 {
			break
		}
		t.add(string(t.part[:i]))
		t.part = t.part[i+1:]
	}
	return len(p), nil
}

func (t *tail) add(line string) {
	line = strings.TrimRight(line, "\r")
	if line == "" {
		return
	}
	if rest, ok := strings.CutPrefix(line, logPrefix); ok {
		t.log.Info("torch worker: " + rest)
	} else {
		t.log.Debug("torch worker", "stderr", line)
	}
	t.lines = append(t.lines, line)
	if len(t.lines) > t.n {
		t.lines = t.lines[len(t.lines)-t.n:]
	}
}

func (t *tail) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.part) > 0 {
		t.add(string(t.part))
		t.part = nil
	}
}

// last is the last line, as ": line" ("" when there is none).
func (t *tail) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return ""
	}
	return ": " + t.lines[len(t.lines)-1]
}

// quote is the last lines, for an error message ("" when there are none).
func (t *tail) quote() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return ""
	}
	return "; its last output:\n  " + strings.Join(t.lines, "\n  ")
}

// missingFrom is what a worker's kindMissing answer to hello says its
// python lacks: modules (torch, if it named none), or a torch new enough.
func missingFrom(we *workerError) *missingError {
	var f struct {
		Modules []string `json:"modules"`
		Torch   string   `json:"torch"`
	}
	_ = json.Unmarshal(we.raw, &f)
	switch {
	case f.Torch != "":
		return &missingError{oldTorch: f.Torch}
	case len(f.Modules) > 0:
		return &missingError{modules: f.Modules}
	}
	return &missingError{modules: []string{"torch"}}
}

var _ io.Writer = (*tail)(nil)

// inductorCacheEnv points torch.compile's kernel cache at psyche's own cache
// directory ($XDG_CACHE_HOME/psyche/torchinductor, else
// ~/.cache/psyche/torchinductor) unless TORCHINDUCTOR_CACHE_DIR is set.
// torch's default lies under /tmp, which a reboot or a CI runner empties:
// there a compiled worker would pay a minute or more per shape on every
// start instead of seconds.
func inductorCacheEnv() (string, bool) {
	if os.Getenv("TORCHINDUCTOR_CACHE_DIR") != "" {
		return "", false
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", false
	}
	return "TORCHINDUCTOR_CACHE_DIR=" + filepath.Join(dir, "psyche", "torchinductor"), true
}

// alive reports whether the worker process has not exited.
func (w *worker) alive() bool {
	select {
	case <-w.exited:
		return false
	default:
		return true
	}
}
