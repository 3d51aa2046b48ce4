package validator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ErrNoNode is returned by Start when node is not installed.
var ErrNoNode = errors.New("validator: node is not on PATH (Node 20 or newer is needed)")

// Validator is a running local validator.
type Validator struct {
	// RPC is the JSON-RPC URL (http://127.0.0.1:PORT).
	RPC string
	// WebSocket is the subscription URL: ws://127.0.0.1:PORT+1, the RPC
	// port + 1, where web3.js and solana-test-validator have it (the RPC
	// port takes websockets as well).
	WebSocket string

	attached bool // Attach: a validator this process did not start
	cmd      *exec.Cmd
	stdin    io.Closer
	done     chan struct{} // closed when the process has exited
	waitErr  error         // valid after done
	stderr   *tail
	stop     sync.Once
	stopErr  error
	closing  chan struct{}
}

// Option configures Start.
type Option func(*config) error

type config struct {
	port     int
	slot     time.Duration
	programs []string // ID=PATH
	dir      string
	node     string
	logger   *slog.Logger
	manual   bool
	set      map[string]bool
}

func once(c *config, name string) error {
	if c.set[name] {
		return fmt.Errorf("validator: %s given twice", name)
	}
	c.set[name] = true
	return nil
}

// WithPort sets the port to listen on; 0 (the default) takes any free one.
func WithPort(port int) Option {
	return func(c *config) error {
		if port < 0 || port > 65535 {
			return fmt.Errorf("validator: port %d out of range", port)
		}
		c.port = port
		return once(c, "WithPort")
	}
}

// WithSlotDuration sets how much wall time one slot takes (default 400ms,
// mainnet's target). Tests that wait for slots use less.
func WithSlotDuration(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond {
			return fmt.Errorf("validator: slot duration %v below 1ms", d)
		}
		c.slot = d
		return once(c, "WithSlotDuration")
	}
}

// WithManualClock makes the Clock sysvar's unix_timestamp stand still at
// the wall time of the start until SetClock moves it (slots still follow
// wall time). Tests use it to play a run in virtual time.
func WithManualClock() Option {
	return func(c *config) error {
		c.manual = true
		return once(c, "WithManualClock")
	}
}

// WithProgram preloads the SBPF shared object at path as an executable
// program at id (base58). It may be given once per program.
func WithProgram(id, path string) Option {
	return func(c *config) error {
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("validator: program %s: %w", id, err)
		}
		c.programs = append(c.programs, id+"="+abs)
		return nil
	}
}

// WithDir sets the directory holding validator.mjs and package.json
// (default: see defaultDir).
func WithDir(dir string) Option {
	return func(c *config) error {
		c.dir = dir
		return once(c, "WithDir")
	}
}

// WithNode sets the node binary (default: node from PATH).
func WithNode(path string) Option {
	return func(c *config) error {
		c.node = path
		return once(c, "WithNode")
	}
}

// WithLogger receives the validator's stderr, one record per line (default:
// discarded, though the last lines still appear in Start's errors).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		c.logger = l
		return once(c, "WithLogger")
	}
}

// defaultDir finds scripts/validator: $PSYCHE_VALIDATOR_DIR, else beside
// this source file in the module (tests, go run), else under the working
// directory (a binary built with -trimpath, run from a checkout).
func defaultDir() (string, error) {
	var candidates []string
	if d := os.Getenv("PSYCHE_VALIDATOR_DIR"); d != "" {
		candidates = append(candidates, d)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		candidates = append(candidates, filepath.Join(filepath.Dir(file), "..", "..", "scripts", "validator"))
	}
	candidates = append(candidates, filepath.Join("scripts", "validator"))
	for _, d := range candidates {
		if _, err := os.Stat(filepath.Join(d, "validator.mjs")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("validator: scripts/validator not found (tried %v; set PSYCHE_VALIDATOR_DIR or use WithDir)", candidates)
}

// installMu serializes `npm ci`: two validators starting at once in one
// process must not both write node_modules.
var installMu sync.Mutex

func ensureInstalled(ctx context.Context, dir string) error {
	installMu.Lock()
	defer installMu.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "litesvm", "package.json")); err == nil {
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("validator: %s has no node_modules and npm is not on PATH", dir)
	}
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("validator: npm ci in %s: %w\n%s", dir, err, out)
	}
	return nil
}

// Start runs the validator and returns once it listens. ctx bounds the
// start (including npm ci), not the validator's life: stop it with Close
// or Run.
func Start(ctx context.Context, opts ...Option) (*Validator, error) {
	c := &config{slot: 400 * time.Millisecond, set: map[string]bool{}}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if c.dir == "" {
		dir, err := defaultDir()
		if err != nil {
			return nil, err
		}
		c.dir = dir
	}
	if c.node == "" {
		node, err := exec.LookPath("node")
		if err != nil {
			return nil, ErrNoNode
		}
		c.node = node
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if err := ensureInstalled(ctx, c.dir); err != nil {
		return nil, err
	}

	args := []string{"validator.mjs", "--port", strconv.Itoa(c.port),
		"--slot-ms", strconv.FormatInt(c.slot.Milliseconds(), 10), "--exit-with-stdin"}
	for _, p := range c.programs {
		args = append(args, "--program", p)
	}
	if c.manual {
		args = append(args, "--manual-clock")
	}
	cmd := exec.Command(c.node, args...)
	cmd.Dir = c.dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	v := &Validator{cmd: cmd, stdin: stdin, done: make(chan struct{}), closing: make(chan struct{}),
		stderr: &tail{max: 8 << 10, logger: c.logger}}
	cmd.Stderr = v.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("validator: %w", err)
	}

	lines := make(chan []byte, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, err := r.ReadBytes('\n')
		if err == nil {
			lines <- line
		}
		// Keep draining so the script never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, r)
	}()
	go func() {
		v.waitErr = cmd.Wait()
		close(v.done)
	}()

	select {
	case line := <-lines:
		var ready struct {
			RPC       string `json:"rpc"`
			WebSocket string `json:"websocket"`
		}
		if err := json.Unmarshal(line, &ready); err != nil || ready.RPC == "" || ready.WebSocket == "" {
			v.Close()
			return nil, fmt.Errorf("validator: unexpected first line %q (%v)", bytes.TrimSpace(line), err)
		}
		v.RPC, v.WebSocket = ready.RPC, ready.WebSocket
		c.logger.Info("local validator listening", "rpc", v.RPC, "websocket", v.WebSocket)
		return v, nil
	case <-v.done:
		return nil, fmt.Errorf("validator: exited before listening (%v): %s", v.waitErr, v.stderr.String())
	case <-ctx.Done():
		v.Close()
		return nil, fmt.Errorf("validator: start: %w; stderr: %s", ctx.Err(), v.stderr.String())
	}
}

// SetClock moves the Clock sysvar to t (whole seconds) on a validator started
// WithManualClock; transactions from then on see that time. The clock never
// goes back. On an attached validator that cannot move its clock (one whose
// clock follows wall time, like solana-test-validator's) it waits until the
// clock has reached t instead.
func (v *Validator) SetClock(ctx context.Context, t time.Time) error {
	err := v.call(ctx, "psycheSetClock", []any{t.Unix()}, nil)
	var re *rpcError
	if v.attached && errors.As(err, &re) && (re.Code == errMethodNotFound || re.Code == -32602) {
		return v.waitClock(ctx, t)
	}
	if err != nil {
		return fmt.Errorf("validator: set clock: %w", err)
	}
	return nil
}

// Done is closed when the validator process has exited.
func (v *Validator) Done() <-chan struct{} { return v.done }

// Close stops the validator and waits for it to exit: it closes its standard
// input and sends SIGTERM, and kills it if it has not exited after 5 seconds.
func (v *Validator) Close() error {
	v.stop.Do(func() {
		if v.attached {
			close(v.closing) // not ours to stop
			return
		}
		close(v.closing)
		_ = v.stdin.Close()
		_ = v.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-v.done:
		case <-time.After(5 * time.Second):
			_ = v.cmd.Process.Kill()
			<-v.done
			v.stopErr = errors.New("validator: did not stop within 5s of SIGTERM; killed")
			return
		}
		var exit *exec.ExitError
		if v.waitErr != nil && !(errors.As(v.waitErr, &exit) && !exit.Exited()) {
			v.stopErr = fmt.Errorf("validator: %w: %s", v.waitErr, v.stderr.String())
		}
	})
	return v.stopErr
}

// Run blocks until ctx is done, then stops the validator. It returns early
// with an error if the validator exits on its own.
func (v *Validator) Run(ctx context.Context) error {
	if v.attached {
		<-ctx.Done()
		return v.Close()
	}
	select {
	case <-ctx.Done():
		return v.Close()
	case <-v.done:
		select {
		case <-v.closing:
			return v.Close()
		default:
		}
		return fmt.Errorf("validator: exited unexpectedly (%v): %s", v.waitErr, v.stderr.String())
	}
}

// tail keeps the last max bytes written to it and logs each complete line.
type tail struct {
	mu     sync.Mutex
	buf    []byte
	max    int
	line   []byte
	logger *slog.Logger
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	t.line = append(t.line, p...)
	for {
		i := bytes.IndexByte(t.line, '\n')
		if i < 0 {
			break
		}
		t.logger.Info("validator", "line", string(t.line[:i]))
		t.line = t.line[i+1:]
	}
	if len(t.line) > t.max {
		t.line = t.line[len(t.line)-t.max:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}
