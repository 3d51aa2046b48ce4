package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/fedclient"
	"github.com/psyche-go/psyche/trainer/data"
)

// splitCorpus writes n different local text files: consecutive slices of
// the bundled Opticks.
func splitCorpus(t *testing.T, dir string, n, size int) []string {
	text := data.Opticks()
	var files []string
	for i := range n {
		f := filepath.Join(dir, fmt.Sprintf("local%d.txt", i+1))
		if err := os.WriteFile(f, text[i*size:(i+1)*size], 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// waitOutput waits until p's output holds s (a hang guard bounds the
// wait; the output is polled, the condition is an event).
func waitOutput(t *testing.T, p *proc, s string) {
	t.Helper()
	guard := time.After(3 * time.Minute)
	for !strings.Contains(p.output(), s) {
		select {
		case <-p.done:
			t.Fatalf("%s exited before writing %q:\n%s", p.name, s, p.output())
		case <-guard:
			t.Fatalf("%s never wrote %q", p.name, s)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var roundLine = regexp.MustCompile(`^federated round (\d+) heldout loss (\S+) train loss (\S+) sent (\d+) stale (\w+)`)

// TestFederatedAcrossProcesses is a federated run as separate OS
// processes: a server, the admin commands, and three clients, each with its
// own key and its own slice of the corpus as --local-data. Along the way
// the test's own client pushes an update trained on a round the server has
// left (refused as stale; it fetches the current model and is accepted),
// and the server is killed with SIGKILL mid-run and restarted on the same
// address (the clients retry; nothing acknowledged is lost). Every client
// ends with a lower held-out loss on its own data than the initial model's.
func TestFederatedAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	dir := t.TempDir()
	srvDir := filepath.Join(dir, "server")
	keys := map[string]string{}
	for _, who := range []string{"admin", "client1", "client2", "client3", "late"} {
		keys[who] = filepath.Join(dir, "keys", who+".json")
		if _, errs, code := psyche(t, "keygen", "--out", keys[who]); code != 0 {
			t.Fatal(errs)
		}
	}
	// Only the admin may create runs on this server.
	startServer := func(listen string) (*proc, string) {
		p := startProc(t, "server", "server", "--dir", srvDir, "--listen", listen, "--tick-interval", "200ms", "--p2p=false",
			"--creators", keys["admin"])
		return p, p.waitLine(t, regexp.MustCompile(`server listening on http://(\S+)`))[1]
	}
	srv, addr := startServer("127.0.0.1:0")
	url := "http://" + addr
	admin := func(args ...string) string {
		t.Helper()
		out, errs, code := psyche(t, append(args, "--server", url, "--key", keys["admin"], "--run-id", "fed")...)
		if code != 0 {
			t.Fatalf("%v: %s %s", args, out, errs)
		}
		return out
	}
	admin("init-coordinator")
	if out := admin("update", "--config", filepath.Join("..", "..", "examples", "federated-run.toml")); !regexp.MustCompile(`federated: ok \(round 0`).MatchString(out) {
		t.Fatalf("update: %s", out)
	}

	const rounds = 8
	files := splitCorpus(t, dir, 3, 60000)
	var clients []*proc
	for i, who := range []string{"client1", "client2", "client3"} {
		clients = append(clients, startProc(t, who, "--log-format", "json", "join", "--server", url, "--key", keys[who],
			"--run-id", "fed", "--local-data", files[i], "--rounds", strconv.Itoa(rounds)))
	}
	// The run has not been started (resumed) yet: every client
	// trains its first round and has its update refused; resumed, the run
	// takes them.
	for _, p := range clients {
		waitOutput(t, p, "federated run paused; waiting")
	}
	if out, _, _ := psyche(t, "status", "--server", url, "--run-id", "fed"); !regexp.MustCompile(`federated: round 0, buffer 0/3`).MatchString(out) {
		t.Fatalf("a paused run took updates: %s", out)
	}
	admin("set-paused", "--resume")
	// waitRound waits for client 1 to report a round ≥ r (an event).
	losses := map[*proc][]float64{}
	waitRound := func(p *proc, r uint64) {
		t.Helper()
		for {
			m := p.waitLine(t, roundLine)
			got, _ := strconv.ParseUint(m[1], 10, 64)
			loss, _ := strconv.ParseFloat(m[2], 64)
			losses[p] = append(losses[p], loss)
			if got >= r {
				return
			}
		}
	}
	waitRound(clients[0], 1)

	// A stale update: the late client trained on round 0, which is gone.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	defer cancel()
	lateKey, err := chain.LoadKeypair(keys["late"])
	if err != nil {
		t.Fatal(err)
	}
	late := fedclient.New(url, "fed", lateKey)
	zeroes := make([]float32, 1)
	if _, _, err := late.Push(ctx, 0, 1, zeroes); !errors.Is(err, federated.ErrNotMember) {
		t.Fatalf("an update before joining: %v, want %v", err, federated.ErrNotMember)
	}
	info, err := late.Join(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]float32, info.Params)
	_, _, err = late.Push(ctx, 0, 1, zero)
	var stale *fedclient.StaleError
	if !errors.As(err, &stale) || stale.Round < 1 {
		t.Fatalf("an update of round 0 at round ≥ 1: %v", err)
	}
	// It recovers: fetches the current model and pushes an update of it (a
	// round may pass meanwhile: then it is stale again, and catches up again).
	for try := 0; ; try++ {
		round, _, err := late.Model(ctx, -1)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = late.Push(ctx, round, 1, zero)
		if err == nil {
			break
		}
		if !errors.As(err, &stale) || try == 20 {
			t.Fatalf("the late client's update of round %d: %v", round, err)
		}
	}

	// Kill the server mid-run and restart it on the same address.
	waitRound(clients[0], 3)
	before, err := late.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, modelBefore, err := late.Model(ctx, -1)
	if err != nil {
		t.Fatal(err)
	}
	srv.signal(syscall.SIGKILL)
	<-srv.done
	srv, _ = startServer(addr)
	after, err := late.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	roundAfter, modelAfter, err := late.Model(ctx, -1)
	if err != nil {
		t.Fatal(err)
	}
	if after.Round < before.Round || after.Contributions < before.Contributions {
		t.Fatalf("the restart lost rounds: before %+v, after %+v", before, after)
	}
	if roundAfter == before.Round && !slices.Equal(modelAfter, modelBefore) {
		t.Fatal("the restart changed the model of one round")
	}
	t.Logf("server killed at round %d (%d updates aggregated, %d buffered), restarted at round %d (%d, %d)",
		before.Round, before.Contributions, before.Buffered, after.Round, after.Contributions, after.Buffered)

	// The clients train on to the last round and leave.
	for i, p := range clients {
		for {
			select {
			case <-p.done:
			case <-ctx.Done():
				t.Fatalf("client %d did not finish", i+1)
			}
			break
		}
		if p.cmd.ProcessState.ExitCode() != 0 {
			t.Fatalf("client %d exited with %d", i+1, p.cmd.ProcessState.ExitCode())
		}
		var first, last float64
		var firstRound, lastRound = -1, -1
		for _, l := range regexp.MustCompile(`(?m)^federated round (\d+) heldout loss (\S+)`).FindAllStringSubmatch(p.output(), -1) {
			r, _ := strconv.Atoi(l[1])
			loss, _ := strconv.ParseFloat(l[2], 64)
			if firstRound < 0 {
				first, firstRound = loss, r
			}
			last, lastRound = loss, r
		}
		if firstRound != 0 || lastRound < rounds {
			t.Fatalf("client %d measured rounds %d to %d", i+1, firstRound, lastRound)
		}
		if !(last < first-0.2) {
			t.Errorf("client %d: held-out loss %.4f at round 0, %.4f at round %d: no improvement on its own data", i+1, first, last, lastRound)
		}
		t.Logf("client %d: held-out loss %.4f at round 0, %.4f at round %d", i+1, first, last, lastRound)
	}
	out, errs, code := psyche(t, "status", "--server", url, "--run-id", "fed")
	if code != 0 || !regexp.MustCompile(`federated: round \d+, buffer \d+/3, \d+ updates aggregated, mean`).MatchString(out) {
		t.Fatalf("status: %s %s", out, errs)
	}
	out, errs, code = psyche(t, "status", "--server", url, "--run-id", "fed", "--json")
	var js struct {
		RunID     string          `json:"run_id"`
		Federated *federated.Info `json:"federated"`
	}
	if err := json.Unmarshal([]byte(out), &js); code != 0 || err != nil || js.RunID != "fed" || js.Federated == nil || js.Federated.Round < rounds {
		t.Fatalf("status --json: %s %s %v", out, errs, err)
	}
}

// TestSecAggAcrossProcesses is a federated run with secure aggregation:
// four client processes, threshold 3; the fourth is killed with SIGKILL
// once the run has aggregated a round, mid-way through whatever phase it
// was in. Every phase it misses closes at the run's secagg_timeout with the
// other three, and they train on; each ends with a lower held-out loss on
// its own data.
func TestSecAggAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	dir := t.TempDir()
	key := func(who string) string {
		k := filepath.Join(dir, "keys", who+".json")
		if _, errs, code := psyche(t, "keygen", "--out", k); code != 0 {
			t.Fatal(errs)
		}
		return k
	}
	adminKey := key("admin")
	srv := startProc(t, "server", "server", "--dir", filepath.Join(dir, "server"), "--listen", "127.0.0.1:0", "--tick-interval", "200ms", "--p2p=false",
		"--creators", adminKey)
	url := "http://" + srv.waitLine(t, regexp.MustCompile(`server listening on http://(\S+)`))[1]
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "federated-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	run := strings.NewReplacer("capacity = 3 ", "capacity = 4 ", "clip = 10.0", "clip = 5.0", "secagg = false", "secagg = true",
		"secagg_threshold = 0 ", "secagg_threshold = 3 ", "secagg_timeout = 0 ", "secagg_timeout = 1 ").Replace(string(example))
	runFile := filepath.Join(dir, "run.toml")
	if err := os.WriteFile(runFile, []byte(run), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"init-coordinator"}, {"update", "--config", runFile}, {"set-paused", "--resume"}} {
		if out, errs, code := psyche(t, append(args, "--server", url, "--key", adminKey, "--run-id", "sa")...); code != 0 {
			t.Fatalf("%v: %s %s", args, out, errs)
		}
	}
	const rounds = 4
	files := splitCorpus(t, dir, 4, 40000)
	var clients []*proc
	for i := range 4 {
		who := fmt.Sprintf("client%d", i+1)
		clients = append(clients, startProc(t, who, "--log-format", "json", "join", "--server", url, "--key", key(who),
			"--run-id", "sa", "--local-data", files[i], "--rounds", strconv.Itoa(rounds)))
	}
	for {
		m := clients[3].waitLine(t, roundLine)
		if m[1] != "0" {
			break
		}
	}
	clients[3].signal(syscall.SIGKILL)
	<-clients[3].done
	for i, p := range clients[:3] {
		<-p.done
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("client %d exited with %d", i+1, code)
		}
		ls := regexp.MustCompile(`(?m)^federated round (\d+) heldout loss (\S+)`).FindAllStringSubmatch(p.output(), -1)
		first, _ := strconv.ParseFloat(ls[0][2], 64)
		last, _ := strconv.ParseFloat(ls[len(ls)-1][2], 64)
		if ls[0][1] != "0" || ls[len(ls)-1][1] != strconv.Itoa(rounds) || !(last < first-0.2) {
			t.Fatalf("client %d: held-out loss %v at round %s, %v at round %s", i+1, first, ls[0][1], last, ls[len(ls)-1][1])
		}
		t.Logf("client %d: held-out loss %.4f at round 0, %.4f at round %d", i+1, first, last, rounds)
	}
	if !strings.Contains(srv.output(), "secure aggregation phase deadline") {
		t.Fatal("no phase closed at its deadline: the dropout was not exercised")
	}
}
