package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/filelock"
	"github.com/psyche-go/psyche/internal/syncbuf"
)

// TestJoinTrains runs `psyche join` against a server backend run that needs a
// single trainer, until the run has trained a few steps.
func TestJoinTrains(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	dir := t.TempDir()
	url := startRealServer(t)
	ctx := context.Background()
	// The example's model and data as they are: seed:1, checked against the
	// example's revision, and builtin:opticks; nothing to prepare.
	runFile := filepath.Join(dir, "run.toml")
	tiny, err := os.ReadFile(filepath.Join("..", "..", "examples", "tiny-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	// One trainer, the only witness: its report ends each round, so the
	// training limit and the epoch are long enough never to pass on a
	// loaded machine (the run's clock is the wall's: join has no other).
	cfg := strings.NewReplacer("init_min_clients = 3", "init_min_clients = 1", "min_clients = 3", "min_clients = 1",
		"warmup_time = 10", "warmup_time = 2", "max_round_train_time = 20", "max_round_train_time = 600",
		"epoch_time = 30 ", "epoch_time = 3600 ", "round_witness_time = 3", "round_witness_time = 1").Replace(string(tiny))
	if err := os.WriteFile(runFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	admin := filepath.Join(dir, "admin.json")
	trainer := filepath.Join(dir, "trainer.json")
	for _, k := range []string{admin, trainer} {
		if _, errs, code := psyche(t, "keygen", "--out", k); code != 0 {
			t.Fatal(errs)
		}
	}
	for _, args := range [][]string{{"init-coordinator"}, {"update", "--config", runFile}, {"set-paused", "--resume"}} {
		if out, errs, code := psyche(t, append(args, "--server", url, "--key", admin, "--run-id", "joined")...); code != 0 {
			t.Fatalf("%v: %s %s", args, out, errs)
		}
	}
	jctx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	var out, errb syncbuf.Buffer
	go func() {
		done <- runContext(jctx, []string{"psyche", "--log-level", "warn", "join", "--server", url, "--key", trainer, "--run-id", "joined",
			"--data-dir", filepath.Join(dir, "data"), "--listen", "/ip4/127.0.0.1/tcp/0",
			"--metrics-addr", "127.0.0.1:0"}, &out, &errb)
	}()
	// Wait for the run to reach step 4 (snapshots are events); the guard
	// only stops a hung test.
	client := serverclient.New(url, nil)
	wctx, cancelWait := context.WithTimeout(ctx, 8*time.Minute)
	defer cancelWait()
	snaps, err := client.Subscribe(wctx, "joined")
	if err != nil {
		t.Fatal(err)
	}
	var last *coordinator.Coordinator
wait:
	for {
		select {
		case s, ok := <-snaps:
			if !ok {
				state := "no snapshot"
				if last != nil {
					state = last.Describe()
				}
				t.Fatalf("the run did not reach step 4: %s\n%s\n%s", state, out.String(), errb.String())
			}
			last = s.State
			if s.State.Progress.Step >= 4 && s.State.RunState == coordinator.RoundTrain {
				break wait
			}
		case code := <-done:
			t.Fatalf("join exited early (%d): %s %s", code, out.String(), errb.String())
		}
	}
	// The metrics endpoint reports the trainer's progress.
	var metricsURL string
	for _, line := range strings.Split(out.String(), "\n") {
		if u, ok := strings.CutPrefix(line, "metrics: "); ok {
			metricsURL = u
		}
	}
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatalf("metrics at %q: %v", metricsURL, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"# TYPE psyche_tokens_total counter", "psyche_step ", "psyche_p2p_peers 0", "# TYPE psyche_compute_seconds_total counter",
		"# TYPE psyche_steps_trained_total counter", "# TYPE psyche_p2p_fetch_seconds histogram", "# TYPE go_goroutines gauge"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	// Counted, not only declared: the trainer trained the steps it took part in.
	var trained float64
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "psyche_steps_trained_total "); ok {
			trained, _ = strconv.ParseFloat(v, 64)
		}
	}
	if trained < 1 {
		t.Errorf("psyche_steps_trained_total is %v after step 4", trained)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("join exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "p2p address: /ip4/127.0.0.1/tcp/") {
		t.Errorf("join did not print its address: %s", out.String())
	}
	// The trainer's files are beside its key and under its data directory.
	k, _ := chain.LoadKeypair(trainer)
	for _, p := range []string{filepath.Join(dir, "trainer.p2p.key"), filepath.Join(dir, "data", "joined", k.Public().String()[:8], "checkpoints")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("join's files: %v", err)
		}
	}
}

// TestJoinRefusesAKeyInUse: a trainer whose key or p2p key another process
// holds (as a running trainer does) refuses to start, naming the file, the
// holder and the remedy. (internal/filelock shows the lock across processes.)
func TestJoinRefusesAKeyInUse(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id.json")
	if _, errs, code := psyche(t, "keygen", "--out", key); code != 0 {
		t.Fatal(errs)
	}
	// Nothing listens there: join must stop at the lock, before any request.
	args := []string{"join", "--server", "http://127.0.0.1:1", "--key", key, "--run-id", "r", "--data-dir", filepath.Join(dir, "data")}
	for _, tc := range []struct{ held, what string }{
		{key, "the key " + key},
		{filepath.Join(dir, "id.p2p.key"), "the p2p key " + filepath.Join(dir, "id.p2p.key")},
	} {
		l, err := filelock.TryLock(tc.held + ".lock")
		if err != nil {
			t.Fatal(err)
		}
		_, errs, code := psyche(t, args...)
		l.Unlock()
		for _, want := range []string{"another trainer is using " + tc.what, tc.held + ".lock", fmt.Sprintf("process %d", os.Getpid()), "each trainer needs its own --key"} {
			if code == 0 || !strings.Contains(errs, want) {
				t.Errorf("join with %s held: %d, error lacks %q: %s", tc.held, code, want, errs)
			}
		}
	}
}

// TestJoinStoreEndpoint: the endpoint a trainer names for its store
// credentials (--store-endpoint, PSYCHE_STORE_ENDPOINT) is checked at start.
func TestJoinStoreEndpoint(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id.json")
	if _, errs, code := psyche(t, "keygen", "--out", key); code != 0 {
		t.Fatal(errs)
	}
	args := []string{"join", "--server", "http://127.0.0.1:1", "--key", key, "--run-id", "r", "--data-dir", filepath.Join(dir, "data")}
	if _, errs, code := psyche(t, append(args, "--store-endpoint", "s3.example.com")...); code == 0 || !strings.Contains(errs, "--store-endpoint") || !strings.Contains(errs, "http(s)://host[:port]") {
		t.Errorf("join --store-endpoint s3.example.com: %d, %s", code, errs)
	}
	t.Setenv("PSYCHE_STORE_ENDPOINT", "ftp://s3.example.com")
	if _, errs, code := psyche(t, args...); code == 0 || !strings.Contains(errs, "ftp://s3.example.com") {
		t.Errorf("join with PSYCHE_STORE_ENDPOINT=ftp://…: %d, %s", code, errs)
	}
}

func TestTrainerPaths(t *testing.T) {
	for key, want := range map[string]string{
		"/home/a/.config/psyche/id.json": "/home/a/.config/psyche/id.p2p.key",
		"trainer2.json":                  "trainer2.p2p.key",
		"/keys/bob":                      "/keys/bob.p2p.key",
	} {
		if got := p2pKeyPath(key); got != want {
			t.Errorf("p2pKeyPath(%q) = %q, want %q", key, got, want)
		}
	}
	t.Setenv("XDG_DATA_HOME", "/xdg")
	if got := defaultDataDir(); got != "/xdg/psyche" {
		t.Errorf("with XDG_DATA_HOME: %q", got)
	}
	t.Setenv("XDG_DATA_HOME", "relative") // the spec says to ignore it
	t.Setenv("HOME", "/home/a")
	if got := defaultDataDir(); got != "/home/a/.local/share/psyche" {
		t.Errorf("without XDG_DATA_HOME: %q", got)
	}

	data := t.TempDir()
	got, err := checkpointDir("", data, "run1", "3JyXUysWZpM4jwEGdCNHwkKaJLdfEpcsUQbnNKkjyPbU")
	if want := filepath.Join(data, "run1", "3JyXUysW", "checkpoints"); err != nil || got != want {
		t.Errorf("checkpointDir = %q, %v; want %q", got, err, want)
	}
	if st, err := os.Stat(got); err != nil || !st.IsDir() {
		t.Errorf("checkpoint directory not made: %v", err)
	}
	override := filepath.Join(data, "elsewhere")
	if got, err := checkpointDir(override, data, "run1", "Addr"); err != nil || got != override {
		t.Errorf("--checkpoint-dir: %q, %v", got, err)
	}
	if _, err := checkpointDir("", data, "..", "Addr"); err == nil || !strings.Contains(err.Error(), "--checkpoint-dir") {
		t.Errorf("run id ..: %v", err)
	}
	if _, err := checkpointDir("", "", "run1", "Addr"); err == nil || !strings.Contains(err.Error(), "--data-dir") {
		t.Errorf("no data directory: %v", err)
	}
}
