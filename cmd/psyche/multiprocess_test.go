package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/programs/validator"
)

// asCLI is the environment variable that makes the test binary the psyche
// command (see TestMain), so that end-to-end tests start real processes
// without building a second binary. Its name lacks the PSYCHE_ prefix, which
// the CLI reserves for its flags.
const asCLI = "BE_PSYCHE_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(asCLI) == "1" {
		os.Exit(run(append([]string{"psyche"}, os.Args[1:]...), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// proc is a psyche command running as its own OS process.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder // stdout and stderr, interleaved
	done chan struct{}
	line chan string   // stdout lines until the first is read (addresses)
	grew chan struct{} // a line was added to out since the last receive
}

func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, nil, args...)
}

// startProcEnv is startProc with more environment variables (a trainer's
// store keys, which no flag carries).
func startProcEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), asCLI+"=1"), env...)
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), line: make(chan string, 64), grew: make(chan struct{}, 1)}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	copyLines := func(r io.Reader, lines chan<- string) {
		defer wg.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.grew <- struct{}{}:
			default:
			}
			if lines != nil {
				select {
				case lines <- sc.Text():
				default:
				}
			}
		}
	}
	wg.Add(2)
	go copyLines(stdout, p.line)
	go copyLines(stderr, nil)
	go func() { wg.Wait(); _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("--- %s output (tail) ---\n%s", p.name, tail(p.output(), 6000))
		}
	})
	return p
}

func (p *proc) signal(sig syscall.Signal) {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitLine returns the first stdout line matching re (a hang guard bounds
// the wait; the line is an event, not a time).
func (p *proc) waitLine(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	guard := time.After(3 * time.Minute)
	for {
		select {
		case l := <-p.line:
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-p.done:
			t.Fatalf("%s exited before printing %v:\n%s", p.name, re, p.output())
		case <-guard:
			t.Fatalf("%s printed no line matching %v", p.name, re)
		}
	}
}

// waitLog returns the first of the process's JSON log records with message
// msg that match accepts, waiting for it as the process writes (a hang guard
// bounds the wait; the record is an event, not a time).
func (p *proc) waitLog(t *testing.T, msg string, accept func(map[string]any) bool) map[string]any {
	t.Helper()
	guard := time.After(3 * time.Minute)
	for {
		for _, r := range logRecords(p.output(), msg) {
			if accept(r) {
				return r
			}
		}
		select {
		case <-p.grew:
		case <-p.done:
			for _, r := range logRecords(p.output(), msg) {
				if accept(r) {
					return r
				}
			}
			t.Fatalf("%s exited without logging %q", p.name, msg)
		case <-guard:
			t.Fatalf("%s logged no %q", p.name, msg)
		}
	}
}

// logRecords parses a process's JSON log lines with the given message.
func logRecords(out, msg string) []map[string]any {
	var recs []map[string]any
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var r map[string]any
		if json.Unmarshal([]byte(l), &r) == nil && r["msg"] == msg {
			recs = append(recs, r)
		}
	}
	return recs
}

// TestServerFlowAcrossProcesses runs the README's server section as separate
// OS processes: a server, the admin commands, and three trainers, each with
// its own key and no --peer (they find each other through the server's p2p
// host and the run's DHT). After two epochs every trainer is killed with
// SIGKILL; restarted, they find no peer holding the model, load the run's
// last recorded checkpoint and train on; all three end with identical
// weights.
func TestServerFlowAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	dir := t.TempDir()
	// The admin's key first: the server lets only it create runs.
	adminKey := filepath.Join(dir, "keys", "admin.json")
	if _, errs, code := psyche(t, "keygen", "--out", adminKey); code != 0 {
		t.Fatal(errs)
	}
	srv := startProc(t, "server", "server", "--dir", filepath.Join(dir, "server"), "--listen", "127.0.0.1:0",
		"--tick-interval", "200ms", "--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--relay", "--creators", adminKey)
	url := "http://" + srv.waitLine(t, regexp.MustCompile(`server listening on http://(\S+)`))[1]
	flowAcrossProcesses(t, flowBackend{runID: "tiny", args: []string{"--server", url}, backend: serverclient.New(url, nil), adminKey: adminKey})
}

// TestSolanaFlowAcrossProcesses is the same run on the Solana backend: a
// local validator with the coordinator program, trainers that tick the run
// themselves, and no server to bootstrap from: they find each other through
// a psyche relay (its DHT and relay) given as --bootstrap and --relay.
func TestSolanaFlowAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	// The validator $PSYCHE_TEST_VALIDATOR names (solana-test-validator with
	// the program loaded: validator.EnvValidator), else `psyche validator`.
	rpc, wsURL, runID := "", "", "tiny"
	if v, ok, err := validator.FromEnv(); ok {
		if err != nil {
			t.Fatal(err)
		}
		rpc, wsURL, runID = v.RPC, v.WebSocket, uniqueRun("tiny")
	} else {
		if _, err := exec.LookPath("node"); err != nil {
			t.Skip("node is not installed: the local validator needs it")
		}
		val := startProc(t, "validator", "--log-level", "warn", "validator", "--port", "0")
		m := val.waitLine(t, regexp.MustCompile(`validator: rpc (\S+), websocket (\S+),`))
		rpc, wsURL = m[1], m[2]
	}
	relay := startProc(t, "relay", "relay", "--listen", "/ip4/127.0.0.1/tcp/0", "--run-id", runID,
		"--p2p-key", filepath.Join(t.TempDir(), "relay.p2p.key"))
	relayAddr := relay.waitLine(t, regexp.MustCompile(`relay address: (\S+)`))[1]
	b, err := solana.New(solana.WithRPC(rpc), solana.WithWebsocket(wsURL))
	if err != nil {
		t.Fatal(err)
	}
	flowAcrossProcesses(t, flowBackend{args: []string{"--rpc", rpc}, backend: b, runID: runID,
		joinArgs: []string{"--bootstrap", relayAddr, "--relay", relayAddr},
		fund: func(k *chain.Keypair) {
			if err := b.Airdrop(context.Background(), k.Public(), 10_000_000_000); err != nil {
				t.Fatal(err)
			}
		}})
}

// flowBackend is where flowAcrossProcesses runs its run.
type flowBackend struct {
	runID    string        // the run's id
	args     []string      // the commands' backend flags
	backend  chain.Backend // the test's own view of the run
	joinArgs []string      // extra flags for join
	fund     func(*chain.Keypair)
	adminKey string // the admin's key file, if the backend needed it first
}

// flowAcrossProcesses is the run both backends play: admin commands, three
// trainers as OS processes each with its own key and no --peer, two epochs,
// every trainer killed with SIGKILL and restarted, one more epoch from the
// recorded checkpoint, and every trainer ending with the same model.
func flowAcrossProcesses(t *testing.T, fb flowBackend) {
	dir := t.TempDir()
	// The example run as it stands, with timeouts that only bound waiting:
	// every round ends when its witnesses have reported, warmup when every
	// trainer has loaded, cooldown when a checkpoint is recorded, and the
	// test ends each epoch by pausing the run (the epoch timer is an hour).
	tiny, err := os.ReadFile(filepath.Join("..", "..", "examples", "tiny-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.NewReplacer("warmup_time = 10", "warmup_time = 600", "cooldown_time = 10", "cooldown_time = 600",
		"max_round_train_time = 20", "max_round_train_time = 600", "epoch_time = 30 ", "epoch_time = 3600 ",
		"round_witness_time = 3", "round_witness_time = 1", "waiting_for_members_extra_time = 2",
		"waiting_for_members_extra_time = 1").Replace(string(tiny))
	runFile := filepath.Join(dir, "run.toml")
	if err := os.WriteFile(runFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, who := range []string{"admin", "trainer1", "trainer2", "trainer3"} {
		keys[who] = filepath.Join(dir, "keys", who+".json")
		if who == "admin" && fb.adminKey != "" {
			keys[who] = fb.adminKey
		} else if _, errs, code := psyche(t, "keygen", "--out", keys[who]); code != 0 {
			t.Fatal(errs)
		}
		if fb.fund != nil {
			k, err := chain.LoadKeypair(keys[who])
			if err != nil {
				t.Fatal(err)
			}
			fb.fund(k)
		}
	}
	admin := func(args ...string) {
		t.Helper()
		if out, errs, code := psyche(t, append(append(args, fb.args...), "--key", keys["admin"], "--run-id", fb.runID)...); code != 0 {
			t.Fatalf("%v: %s %s", args, out, errs)
		}
	}
	admin("init-coordinator")
	admin("update", "--config", runFile)
	admin("set-paused", "--resume")
	// The data directory is short: recorded checkpoint URLs (which hold the
	// path) have 128 bytes, and t.TempDir's names are long.
	data, err := os.MkdirTemp("", "psy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	join := func(who string) *proc {
		args := append([]string{"--log-format", "json", "join", "--key", keys[who], "--run-id", fb.runID,
			"--data-dir", data, "--listen", "/ip4/127.0.0.1/tcp/0", "--mdns=false"}, fb.args...)
		return startProc(t, who, append(args, fb.joinArgs...)...)
	}
	trainers := []string{"trainer1", "trainer2", "trainer3"}
	var procs []*proc
	for _, who := range trainers {
		procs = append(procs, join(who))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute) // a hang guard
	defer cancel()
	snaps, err := fb.backend.Subscribe(ctx, fb.runID)
	if err != nil {
		t.Fatal(err)
	}
	var lastState coordinator.RunState
	waitState := func(what string, cond func(*coordinator.Coordinator) bool) *coordinator.Coordinator {
		t.Helper()
		for {
			select {
			case s, ok := <-snaps:
				if !ok {
					t.Fatalf("the run's snapshots ended before %s", what)
				}
				if s.State.RunState != lastState {
					lastState = s.State.RunState
					t.Logf("run: %s, epoch %d, step %d", lastState, s.State.Progress.Epoch, s.State.Progress.Step)
				}
				if cond(s.State) {
					return s.State
				}
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	// trainEpoch lets the run train three steps of an epoch, then pauses
	// it: the epoch ends after its round, a checkpoint is recorded in the
	// cooldown, and the run waits, paused, for the next.
	trainEpoch := func(epoch uint32) *coordinator.Coordinator {
		t.Helper()
		start := waitState(fmt.Sprintf("epoch %d training", epoch), func(s *coordinator.Coordinator) bool {
			return s.Progress.Epoch == epoch && s.RunState == coordinator.RoundTrain
		}).Progress.Step
		waitState(fmt.Sprintf("three steps of epoch %d", epoch), func(s *coordinator.Coordinator) bool {
			return s.Progress.Step >= start+3
		})
		admin("set-paused")
		return waitState(fmt.Sprintf("epoch %d ended", epoch), func(s *coordinator.Coordinator) bool {
			return s.RunState == coordinator.Paused
		})
	}
	trainEpoch(0)
	admin("set-paused", "--resume")
	// Two epochs trained and a checkpoint recorded: the run is paused, a
	// quiet point to pull the plug.
	before := trainEpoch(1)
	if url := coordinator.FixedString(before.Model.Checkpoint.Source.URL[:]); !strings.HasPrefix(url, "file://") {
		t.Fatalf("no checkpoint recorded after two epochs (source %q)", url)
	}
	for _, p := range procs {
		if strings.Contains(p.output(), `"--peer"`) {
			t.Fatal("a trainer was given --peer")
		}
		p.signal(syscall.SIGKILL)
		<-p.done
	}
	stepAtKill := before.Progress.Step
	procs = procs[:0]
	for _, who := range trainers {
		procs = append(procs, join(who))
	}
	admin("set-paused", "--resume")
	after := trainEpoch(before.Progress.Epoch)
	if after.Progress.Step <= stepAtKill {
		t.Fatalf("no step trained after the restart (step %d, was %d)", after.Progress.Step, stepAtKill)
	}
	// The run pauses when the epoch's last round ends, which a trainer may
	// not have applied yet: stop each one only once it has shared the
	// epoch's model (what is checked below).
	for _, p := range procs {
		p.waitLog(t, "model shared with joiners", func(r map[string]any) bool {
			return fmt.Sprint(r["epoch"]) == fmt.Sprint(after.Progress.Epoch)
		})
	}
	for _, p := range procs {
		p.signal(syscall.SIGTERM)
		<-p.done
	}
	// The restarted trainers loaded the recorded checkpoint: from its file,
	// or from a restarted trainer that loaded the file and offered it (a
	// trainer that reads the file offers it, for trainers on other disks);
	// at least one had to read it. They all offered the same model
	// (manifest ids hash every tensor) to the epoch after the last one they
	// trained.
	manifests := map[string]string{}
	fellBack := 0
	for i, p := range procs {
		out := p.output()
		fellBack += len(logRecords(out, "no client of the previous epoch offers its model; loading the run's last recorded checkpoint"))
		if len(logRecords(out, "model loaded")) == 0 {
			t.Errorf("%s loaded no model after the restart", trainers[i])
		}
		shared := logRecords(out, "model shared with joiners")
		for _, r := range shared {
			if fmt.Sprint(r["epoch"]) == fmt.Sprint(after.Progress.Epoch) {
				manifests[trainers[i]] = fmt.Sprint(r["manifest"])
			}
		}
	}
	if fellBack == 0 {
		t.Error("no restarted trainer loaded the recorded checkpoint's file")
	}
	if len(manifests) != len(trainers) {
		t.Fatalf("models shared for epoch %d: %v (want one per trainer)", after.Progress.Epoch, manifests)
	}
	for who, m := range manifests {
		if m != manifests[trainers[0]] {
			t.Errorf("%s ended with model %s, %s with %s", who, m, trainers[0], manifests[trainers[0]])
		}
	}
	t.Logf("killed at step %d (epoch %d), trained on to step %d (epoch %d); every trainer's model is %s",
		stepAtKill, before.Progress.Epoch, after.Progress.Step, after.Progress.Epoch, manifests[trainers[0]])
}
