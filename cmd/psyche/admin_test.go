package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/chain/serverwire"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/explorer"
	"github.com/psyche-go/psyche/internal/quietclock"
)

// startServer runs a server backend on 127.0.0.1 with a settable clock (no
// background ticks: the test ticks through the CLI).
func startServer(t *testing.T) (string, *quietclock.Clock) {
	t.Helper()
	clock := quietclock.New(time.Unix(1_750_000_000, 0)) // moved only by the test
	return serve(t, server.WithClock(clock.Now), server.WithManualTicks()), clock
}

// startRealServer runs a server backend on wall time, ticking every 100 ms.
func startRealServer(t *testing.T) string {
	t.Helper()
	return serve(t, server.WithTickInterval(100*time.Millisecond))
}

// serve runs a server backend on 127.0.0.1 until the test ends and returns its URL.
func serve(t *testing.T, opts ...server.Option) string {
	t.Helper()
	s, err := server.New(t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + l.Addr().String()
}

func psyche(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"psyche"}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

// adminFlow runs the admin commands every backend must serve, with the
// backend selected by backendArgs (--server URL or --rpc URL): keygen for
// admin, alice, bob and carol (fund pays for them where that is needed),
// init-coordinator, update and resume (refused to anyone but the admin), two
// joins (what `psyche join` sends first; too few to start an epoch), a tick
// and status --json. It returns the key files and a runner of commands as a
// given key on run runID.
func adminFlow(t *testing.T, b chain.Backend, backendArgs []string, runID string, fund func(*chain.Keypair)) (map[string]string, func(who string, args ...string) (string, string, int)) {
	t.Helper()
	dir := t.TempDir()
	keys := map[string]string{}
	for _, name := range []string{"admin", "alice", "bob", "carol"} {
		keys[name] = filepath.Join(dir, name+".json")
		if out, errs, code := psyche(t, "keygen", "--out", keys[name]); code != 0 || !strings.Contains(out, "address: ") {
			t.Fatalf("keygen: %d %s %s", code, out, errs)
		}
		k, err := chain.LoadKeypair(keys[name])
		if err != nil {
			t.Fatal(err)
		}
		fund(k)
	}
	as := func(who string, args ...string) (string, string, int) {
		return psyche(t, append(append(args, backendArgs...), "--key", keys[who], "--run-id", runID)...)
	}
	if out, errs, code := as("admin", "init-coordinator"); code != 0 || !strings.Contains(out, "init_coordinator: ok") {
		t.Fatalf("init: %d %s %s", code, out, errs)
	}
	runFile := filepath.Join("..", "..", "examples", "tiny-run.toml")
	if _, errs, code := as("alice", "update", "--config", runFile); code == 0 || !strings.Contains(errs, "main authority") {
		t.Fatalf("update by alice: %d %s", code, errs)
	}
	if out, errs, code := as("admin", "update", "--config", runFile); code != 0 {
		t.Fatalf("update: %d %s %s", code, out, errs)
	}
	if _, errs, code := as("bob", "set-paused", "--resume"); code == 0 || !strings.Contains(errs, "main authority") {
		t.Fatalf("resume by bob: %d %s", code, errs)
	}
	// A run still paused has nothing to tick: an error that says what to
	// do (it exited 0 with "run is halted").
	if _, errs, code := as("alice", "tick"); code == 0 || !strings.Contains(errs, "psyche set-paused --resume") {
		t.Fatalf("tick of a paused run: %d %s", code, errs)
	}
	if out, errs, code := as("admin", "set-paused", "--resume"); code != 0 || !strings.Contains(out, "WaitingForMembers") {
		t.Fatalf("resume: %d %s %s", code, out, errs)
	}
	var joined []string
	for i, name := range []string{"alice", "bob"} {
		if err := joinAs(b, runID, keys[name], byte(i+1)); err != nil {
			t.Fatal(err)
		}
		k, _ := chain.LoadKeypair(keys[name])
		joined = append(joined, k.Public().String())
	}
	// Two of the three joiners the run needs: nothing is due.
	if out, errs, code := as("alice", "tick"); code != 0 || !strings.Contains(out, "tick: nothing to do (WaitingForMembers)") {
		t.Fatalf("tick: %d %s %s", code, out, errs)
	}
	out, errs, code := psyche(t, append([]string{"status", "--run-id", runID, "--json"}, backendArgs...)...)
	if code != 0 {
		t.Fatalf("status: %d %s", code, errs)
	}
	var v statusView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out)
	}
	if v.State != "WaitingForMembers" || !slices.Equal(v.Pending, joined) {
		t.Fatalf("status: %+v", v)
	}
	return keys, as
}

// joinAs sends the join `psyche join` starts with, for the key in keyFile
// with a p2p identity made of one byte.
func joinAs(b chain.Backend, runID, keyFile string, p2pByte byte) error {
	k, err := chain.LoadKeypair(keyFile)
	if err != nil {
		return err
	}
	_, err = b.Send(context.Background(), runID, k, nil, &coordinator.JoinRun{ID: coordinator.ClientID{Signer: k.Public(), P2P: coordinator.Pubkey{p2pByte}}})
	return err
}

func TestAdminFlowOnTheServerBackend(t *testing.T) {
	url, clock := startServer(t)
	backendArgs := []string{"--server", url}
	keys, as := adminFlow(t, serverclient.New(url, nil), backendArgs, "cli", func(*chain.Keypair) {})
	// A third trainer makes init_min_clients; once the extra wait is over a
	// tick starts the epoch.
	if err := joinAs(serverclient.New(url, nil), "cli", keys["carol"], 3); err != nil {
		t.Fatal(err)
	}
	clock.Advance(3 * time.Second)
	if out, errs, code := as("bob", "tick"); code != 0 || !strings.Contains(out, "WaitingForMembers -> Warmup") {
		t.Fatalf("tick: %d %s %s", code, out, errs)
	}
	out, errs, code := psyche(t, "status", "--server", url, "--run-id", "cli", "--json")
	if code != 0 {
		t.Fatalf("status: %d %s", code, errs)
	}
	var v statusView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out)
	}
	if v.State != "Warmup" || len(v.Clients) != 3 || v.Clients[0].State != "Healthy" || v.Round == nil || v.Checkpoint.Kind != "Hub" {
		t.Fatalf("status: %+v", v)
	}
	out, _, _ = psyche(t, "status", "--server", url, "--run-id", "cli")
	for _, want := range []string{"run cli: Warmup", "members (3)", "checkpoint: Hub"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if _, errs, code := psyche(t, "status", "--server", url, "--run-id", "nope"); code == 0 || !strings.Contains(errs, "no such run") {
		t.Fatalf("status of a missing run: %d %s", code, errs)
	}
	// Alice's key is a client of the epoch under the p2p identity its join
	// gave; a trainer on the same key with another p2p key (another machine)
	// is told so at once (it looped on "no peer offers a checkpoint"). The
	// context only stops a trainer that would wrongly start.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var jout, jerr bytes.Buffer
	code = runContext(ctx, []string{"psyche", "join", "--server", url, "--run-id", "cli", "--key", keys["alice"],
		"--data-dir", filepath.Join(t.TempDir(), "data"), "--listen", "/ip4/127.0.0.1/tcp/0", "--mdns=false"}, &jout, &jerr)
	if code == 0 || !strings.Contains(jerr.String(), "is a client of run \"cli\"'s current epoch under another p2p identity (12D3KooW") {
		t.Fatalf("join on a key in use: exit %d, %s", code, jerr.String())
	}
}

func TestRunFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	for _, tc := range []struct {
		name, content string
		want          []string
	}{
		{"unknown.toml", "[config]\nwarmup_tme = 3\n", []string{"unknown keys: config.warmup_tme"}},
		{"syntax.toml", "[config\n", []string{"syntax.toml"}},
		{"rules.toml", "[config]\nepoch_time = 10\nwarmup_time = 20\nmax_round_train_time = 1\nround_witness_time = 1\ncooldown_time = 1\nwaiting_for_members_extra_time = 1\nglobal_batch_size_start = 4\nglobal_batch_size_end = 4\ntotal_steps = 1\ninit_min_clients = 2\nmin_clients = 3\n",
			[]string{"warmup_time (20) must be less than epoch_time (10)", "min_clients (3) must not exceed init_min_clients (2)"}},
		{"range.toml", "[config]\nglobal_batch_size_end = 70000\n", []string{"global_batch_size_end = 70000 does not fit"}},
		{"enum.toml", "[model]\narchitecture = \"rnn\"\n[model.lr]\nschedule = \"step\"\n", []string{"model.architecture = \"rnn\"", "model.lr.schedule = \"step\""}},
		{"aggregation.toml", "[model.optimizer]\naggregation = \"median\"\n",
			[]string{`model.optimizer.aggregation = "median": want one of clipped-mean, mean, robust`}},
		{"normalize.toml", "[model.optimizer]\nnormalize = \"adam\"\n",
			[]string{`model.optimizer.normalize = "adam": want one of none, rms`}},
		{"sources.toml", "[model]\ndata = \"builtin:shakespeare\"\n[model.checkpoint]\nurl = \"seed:one\"\n",
			[]string{`model.checkpoint.url: modelspec: unsupported checkpoint source (seed:N, file://, http(s):// and s3:// are): "seed:one"`,
				`model.data = "builtin:shakespeare": no such built-in corpus (the built-in ones are builtin:opticks)`}},
		{"llama-range.toml", "[model]\nn_kv_heads = 5000000000\n", []string{"model.n_kv_heads = 5000000000 does not fit"}},
		// TOML's decoder wrapped these into 2⁶⁴−n: an epoch of 584 billion
		// years was accepted, the others "did not fit".
		{"negative.toml", "[config]\nepoch_time = -5\ntotal_steps = -1\n[model]\nd_model = -64\n[federated]\ncapacity = -3\n",
			[]string{"config.epoch_time = -5: must not be negative", "config.total_steps = -1: must not be negative",
				"model.d_model = -64: must not be negative", "federated.capacity = -3: must not be negative"}},
	} {
		_, err := loadRunFile(write(tc.name, tc.content))
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error lacks %q:\n%v", tc.name, w, err)
			}
		}
	}
	// The checkpoint store's rules, in an otherwise valid run file.
	tiny, err := os.ReadFile(filepath.Join("..", "..", "examples", "tiny-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ keys, want string }{
		{"store = \"s3://Ckpt/runs/\"\nendpoint = \"http://minio:9000\"", `store "s3://Ckpt/runs/": bucket "Ckpt" must be 3 to 63 of a-z`},
		{"store = \"s3://ckpt/runs\"\nendpoint = \"minio:9000\"", `store endpoint "minio:9000" must start with http:// or https://`},
		{"region = \"us-east-1\"", "store endpoint and region need a store url"},
		{"store = \"s3://ckpt/" + strings.Repeat("a", 70) + "\"", "model.checkpoint.store: 80 bytes, at most 64"},
		{"store = \"s3://ckpt/runs\"\nendpoint = \"http://127.0.0.1:9000\"\nregion = \"us-east-1\"", ""},
	} {
		content := strings.Replace(string(tiny), "[model.checkpoint]\n", "[model.checkpoint]\n"+tc.keys+"\n", 1)
		u, err := loadRunFile(write("store.toml", content))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.keys, err)
		case tc.want == "" && coordinator.FixedString(u.Model.Store.Endpoint[:]) != "http://127.0.0.1:9000":
			t.Errorf("%s: store endpoint not read", tc.keys)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %s", tc.keys, err, tc.want)
		}
	}
	for _, p := range []string{"tiny-run.toml", "run.toml", "llama-bytes-run.toml", "llama-run.toml", "llama-1b-run.toml"} {
		if _, err := loadRunFile(filepath.Join("..", "..", "examples", p)); err != nil {
			t.Errorf("examples/%s: %v", p, err)
		}
	}
}

func TestBadLoggingFlags(t *testing.T) {
	for _, args := range [][]string{{"--log-format", "xml", "status", "--run-id", "x"}, {"--log-level", "loud", "status", "--run-id", "x"}} {
		if _, errs, code := psyche(t, args...); code == 0 || !strings.Contains(errs, "must be") {
			t.Errorf("%v: %d %s", args, code, errs)
		}
	}
}

// TestKeygenRefusesToOverwrite: keygen never silently replaces a key (that
// would lose the address it held), says how to make one per trainer, and
// --force replaces.
func TestKeygenRefusesToOverwrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.json")
	out, errs, code := psyche(t, "keygen", "--out", path)
	if code != 0 {
		t.Fatalf("keygen: %d %s", code, errs)
	}
	first, _ := chain.LoadKeypair(path)
	for _, want := range []string{"needs its own key", "psyche keygen --out " + filepath.Join(filepath.Dir(path), "trainer2.json"), "--key"} {
		if !strings.Contains(out, want) {
			t.Errorf("keygen output lacks %q:\n%s", want, out)
		}
	}
	_, errs, code = psyche(t, "keygen", "--out", path)
	if code == 0 || !strings.Contains(errs, path) || !strings.Contains(errs, "--force") || !strings.Contains(errs, first.Public().String()) {
		t.Fatalf("keygen over a key: %d %s", code, errs)
	}
	if k, _ := chain.LoadKeypair(path); k.Public() != first.Public() {
		t.Fatal("the refused keygen changed the key")
	}
	if _, errs, code = psyche(t, "keygen", "--out", path, "--force"); code != 0 {
		t.Fatalf("keygen --force: %d %s", code, errs)
	}
	if k, _ := chain.LoadKeypair(path); k.Public() == first.Public() {
		t.Fatal("keygen --force kept the old key")
	}
}

// TestRunFileLlama: examples/llama-bytes-run.toml's model fields reach the
// coordinator's model, and edits of them break the coordinator's rules with
// errors that name them.
func TestRunFileLlama(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "llama-bytes-run.toml")
	u, err := loadRunFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := u.Model; m.Architecture != coordinator.ArchLlama || m.NKVHeads != 2 || m.IntermediateSize != 176 || m.RopeTheta != 10000 || !m.TiedHead {
		t.Fatalf("model %+v", m)
	}
	text, _ := os.ReadFile(path)
	for _, tc := range []struct {
		from, to string
		want     []string
	}{
		{`architecture = "llama"`, `architecture = "gpt"`, []string{"n_kv_heads, intermediate_size, rope_theta and tied_head must be zero for GPT"}},
		{"n_kv_heads = 2 ", "n_kv_heads = 3 ", []string{"n_kv_heads (3) must be positive and divide n_heads (4)"}},
		{"intermediate_size = 176", "intermediate_size = 0", []string{"intermediate_size must be greater than 0"}},
		{"rope_theta = 10000.0", "rope_theta = 0.5", []string{"rope_theta must be finite and greater than 1"}},
	} {
		p := filepath.Join(t.TempDir(), "run.toml")
		if !bytes.Contains(text, []byte(tc.from)) {
			t.Fatalf("the example lacks %q", tc.from)
		}
		_ = os.WriteFile(p, bytes.Replace(text, []byte(tc.from), []byte(tc.to), 1), 0o644)
		_, err := loadRunFile(p)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v lacks %q", tc.to, err, w)
			}
		}
	}
}

// TestServerCreators: --creators takes addresses, key files and "any"; the
// default key file may be missing (nobody may create, and the server says
// so), a file named explicitly may not; whoever is not listed is refused.
func TestServerCreators(t *testing.T) {
	dir := t.TempDir()
	adminFile := filepath.Join(dir, "admin.json")
	if _, errs, code := psyche(t, "keygen", "--out", adminFile); code != 0 {
		t.Fatal(errs)
	}
	admin, err := chain.LoadKeypair(adminFile)
	if err != nil {
		t.Fatal(err)
	}
	other := chain.KeypairFromSeed([32]byte{7})
	missing := filepath.Join(dir, "missing.json")
	for _, tt := range []struct {
		name     string
		values   []string
		explicit bool
		says     string
		allowed  []*chain.Keypair // may create; the others of admin and other may not
		err      string
	}{
		{"key file", []string{adminFile}, true, admin.Public().String(), []*chain.Keypair{admin}, ""},
		{"address", []string{other.Public().String()}, true, other.Public().String(), []*chain.Keypair{other}, ""},
		{"any", []string{"any"}, true, "any key", []*chain.Keypair{admin, other}, ""},
		{"missing default key file", []string{missing}, false, "nobody", nil, ""},
		{"missing key file named", []string{missing}, true, "", nil, "neither an address nor a key file"},
		{"neither", []string{"not-a-key"}, true, "", nil, "neither an address nor a key file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			opt, err := parseCreators(tt.values, tt.explicit, 4, &out)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error with %q", err, tt.err)
				}
				return
			}
			if err != nil || !strings.Contains(out.String(), tt.says) {
				t.Fatalf("got %v, printed %q, want it to say %q", err, out.String(), tt.says)
			}
			url := serve(t, opt)
			c := serverclient.New(url, nil)
			for i, k := range []*chain.Keypair{admin, other} {
				id := fmt.Sprintf("run%d", i)
				rid, _ := coordinator.ParseRunID(id)
				_, err := c.Send(context.Background(), id, k, nil, &coordinator.InitCoordinator{MainAuthority: k.Public(), RunID: rid})
				if want := slices.Contains(tt.allowed, k); want != (err == nil) || !want && !errors.Is(err, serverwire.ErrNotCreator) {
					t.Errorf("key %d creating a run: %v (allowed: %v)", i, err, want)
				}
			}
		})
	}
}

// TestRunFileOptimizerEnums: model.optimizer.aggregation and .normalize
// name their rule, and a run file that leaves one out gets its zero value
// (robust, rms).
func TestRunFileOptimizerEnums(t *testing.T) {
	example, err := os.ReadFile(tinyRun)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key, example string
		want         map[string]uint8
		got          func(*coordinator.Optimizer) uint8
	}{
		{"aggregation", "robust", map[string]uint8{"": uint8(coordinator.AggregationRobust), "robust": uint8(coordinator.AggregationRobust),
			"mean": uint8(coordinator.AggregationMean), "clipped-mean": uint8(coordinator.AggregationClippedMean)},
			func(o *coordinator.Optimizer) uint8 { return uint8(o.Aggregation) }},
		{"normalize", "rms", map[string]uint8{"": uint8(coordinator.NormalizationRMS), "rms": uint8(coordinator.NormalizationRMS),
			"none": uint8(coordinator.NormalizationNone)},
			func(o *coordinator.Optimizer) uint8 { return uint8(o.Normalization) }},
	} {
		line := regexp.MustCompile(`(?m)^` + tc.key + ` = "` + tc.example + `".*$`)
		if !line.Match(example) {
			t.Fatalf("examples/tiny-run.toml has no %s line", tc.key)
		}
		for value, want := range tc.want {
			repl := ""
			if value != "" {
				repl = tc.key + ` = "` + value + `"`
			}
			p := filepath.Join(t.TempDir(), "run.toml")
			if err := os.WriteFile(p, line.ReplaceAll(example, []byte(repl)), 0o644); err != nil {
				t.Fatal(err)
			}
			u, err := loadRunFile(p)
			if err != nil {
				t.Fatalf("%s %q: %v", tc.key, value, err)
			}
			if got := tc.got(&u.Model.Optimizer); got != want {
				t.Errorf("%s %q: %d, want %d", tc.key, value, got, want)
			}
		}
	}
}

// TestUnknownCommandAndVersion: a mistyped command names the nearest one
// (urfave/cli said "No help topic for 'jion'"), an unknown one says so, and
// --version answers.
func TestUnknownCommandAndVersion(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"jion", `"jion" is not a psyche command; did you mean "join"?`},
		{"stauts", `did you mean "status"?`},
		{"localnte", `did you mean "localnet"?`},
		{"frobnicate", `"frobnicate" is not a psyche command (psyche --help lists them)`},
	} {
		if _, errs, code := psyche(t, tc.arg); code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("psyche %s: exit %d, %q; want %q", tc.arg, code, errs, tc.want)
		}
	}
	if out, errs, code := psyche(t, "--version"); code != 0 || !strings.HasPrefix(out, "psyche version ") || !strings.Contains(out, "go1.") {
		t.Errorf("--version: exit %d, %q %q", code, out, errs)
	}
	if got := editDistance("jion", "join"); got != 1 {
		t.Errorf("editDistance(jion, join) = %d, want 1 (a swap)", got)
	}
}

// TestNobodyListens: a command pointed at an address where no server runs
// says what to do, not only "connection refused".
func TestNobodyListens(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a port nothing listens on
	key := filepath.Join(t.TempDir(), "id.json")
	if _, errs, code := psyche(t, "keygen", "--out", key); code != 0 {
		t.Fatal(errs)
	}
	for _, args := range [][]string{{"status", "--run-id", "x"}, {"tick", "--run-id", "x", "--key", key}} {
		_, errs, code := psyche(t, append(args, "--server", "http://"+addr)...)
		if code == 0 || !strings.Contains(errs, "nothing listens at http://"+addr+" (--server): start `psyche server` there") {
			t.Errorf("%v: exit %d, %s", args, code, errs)
		}
	}
}

// TestServerThatCannotBindWritesNothing: a server whose address is taken
// stops before it writes its identity or p2p key into --dir.
func TestServerThatCannotBindWritesNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := filepath.Join(t.TempDir(), "server")
	_, errs, code := psyche(t, "server", "--dir", dir, "--listen", l.Addr().String(), "--creators", "any")
	if code == 0 || !strings.Contains(errs, "--listen") || !strings.Contains(errs, "address already in use") {
		t.Fatalf("exit %d, %s", code, errs)
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		t.Fatalf("%s holds %d files after the failed start", dir, len(entries))
	}
}

// TestLocalnetFailureLeavesNoTempDir: a localnet that fails (here: its
// explorer's address is taken) removes the temporary directory it made.
func TestLocalnetFailureLeavesNoTempDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, errs, code := psyche(t, "localnet", "--explorer-addr", l.Addr().String(), "--epochs", "1")
	if code == 0 || !strings.Contains(errs, "address already in use") {
		t.Fatalf("localnet with its explorer's address taken: exit %d, %s", code, errs)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "psyche-localnet-*")); len(left) > 0 {
		t.Fatalf("left behind: %v (%s)", left, errs)
	}
}

// TestStatusP2PIDs: status prints a client's p2p identity as libp2p, the
// trainers' logs and the explorer do ("12D3KooW…"), not as base58 of the
// raw key.
func TestStatusP2PIDs(t *testing.T) {
	s := &coordinator.Coordinator{RunState: coordinator.RoundTrain}
	s.Epoch.ClientsLen = 1
	s.Epoch.Clients[0] = coordinator.Client{ID: coordinator.ClientID{Signer: coordinator.Pubkey{1}, P2P: coordinator.Pubkey{2}}}
	v := viewOf(s, time.Unix(0, 0))
	if len(v.Clients) != 1 || !strings.HasPrefix(v.Clients[0].P2P, "12D3KooW") || v.Clients[0].P2P != explorer.PeerID(coordinator.Pubkey{2}) {
		t.Fatalf("clients %+v", v.Clients)
	}
}

// TestJoinNamesMissingData: a trainer that cannot read the run's local data
// file says so before it joins, naming model.data and where a relative path
// is read from (it failed only after joining, without either).
func TestJoinNamesMissingData(t *testing.T) {
	url, _ := startServer(t)
	dir := t.TempDir()
	admin, trainer := filepath.Join(dir, "admin.json"), filepath.Join(dir, "trainer.json")
	for _, k := range []string{admin, trainer} {
		if _, errs, code := psyche(t, "keygen", "--out", k); code != 0 {
			t.Fatal(errs)
		}
	}
	tiny, err := os.ReadFile(filepath.Join("..", "..", "examples", "tiny-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	runFile := filepath.Join(dir, "run.toml")
	text := strings.Replace(string(tiny), `data = "builtin:opticks"`, `data = "no/such/corpus.tokens"`, 1)
	if text == string(tiny) {
		t.Fatal("examples/tiny-run.toml changed: its data line was not found")
	}
	if err := os.WriteFile(runFile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"init-coordinator"}, {"update", "--config", runFile}} {
		if _, errs, code := psyche(t, append(args, "--server", url, "--key", admin, "--run-id", "nodata")...); code != 0 {
			t.Fatalf("%v: %s", args, errs)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // stops a trainer that would wrongly start
	defer cancel()
	var out, errb bytes.Buffer
	code := runContext(ctx, []string{"psyche", "join", "--server", url, "--run-id", "nodata", "--key", trainer,
		"--data-dir", filepath.Join(dir, "data"), "--listen", "/ip4/127.0.0.1/tcp/0", "--mdns=false"}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), `the run's model.data is "no/such/corpus.tokens", which this trainer cannot read`) ||
		!strings.Contains(errb.String(), "a relative path is read from the trainer's working directory") {
		t.Fatalf("join: exit %d, %s", code, errb.String())
	}
}

// TestFreeCoordinator removes a halted run and creates it again under the
// same id; a run in an epoch, or another key, is refused with what to do.
func TestFreeCoordinator(t *testing.T) {
	url, clock := startServer(t)
	b := serverclient.New(url, nil)
	keys, as := adminFlow(t, b, []string{"--server", url}, "again", func(*chain.Keypair) {})
	if _, errs, code := as("alice", "free-coordinator"); code == 0 || !strings.Contains(errs, "main authority") {
		t.Fatalf("free by alice: %d %s", code, errs)
	}
	if err := joinAs(b, "again", keys["carol"], 3); err != nil {
		t.Fatal(err)
	}
	clock.Advance(3 * time.Second)
	if out, errs, code := as("bob", "tick"); code != 0 || !strings.Contains(out, "-> Warmup") {
		t.Fatalf("tick: %d %s %s", code, out, errs)
	}
	if _, errs, code := as("admin", "free-coordinator"); code == 0 || !strings.Contains(errs, "pause it first (psyche set-paused --run-id again") {
		t.Fatalf("free during an epoch: %d %s", code, errs)
	}
	// A pause asked for during an epoch takes effect when the epoch ends:
	// with nobody training, the clock and ticks get it there.
	if out, errs, code := as("admin", "set-paused"); code != 0 {
		t.Fatalf("pause: %d %s %s", code, out, errs)
	}
	for i := 0; i < 100; i++ {
		snap, err := b.Snapshot(context.Background(), "again")
		if err != nil {
			t.Fatal(err)
		}
		if snap.State.RunState.Halted() {
			break
		}
		clock.Advance(5 * time.Second)
		as("bob", "tick")
	}
	// It says the run is gone (it printed "ok (Paused -> Paused …)").
	if out, errs, code := as("admin", "free-coordinator"); code != 0 || !strings.Contains(out, `free_coordinator: ok: run "again" removed (it was Paused); psyche init-coordinator --run-id again creates it anew`) {
		t.Fatalf("free: %d %s %s", code, out, errs)
	}
	if _, errs, code := psyche(t, "status", "--server", url, "--run-id", "again"); code == 0 || !strings.Contains(errs, "no such run") {
		t.Fatalf("status of a freed run: %d %s", code, errs)
	}
	if out, errs, code := as("admin", "init-coordinator"); code != 0 || !strings.Contains(out, "init_coordinator: ok") {
		t.Fatalf("init again: %d %s %s", code, out, errs)
	}
}

// TestStatusHistory: psyche server keeps its explorer's history in its
// directory, and status --history prints it as CSV from the server.
func TestStatusHistory(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "admin.json")
	if _, errs, code := psyche(t, "keygen", "--out", key); code != 0 {
		t.Fatal(errs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOn{want: "explorer: http://", cancel: func() {}}
	done := make(chan int, 1)
	go func() {
		done <- runContext(ctx, []string{"psyche", "server", "--dir", filepath.Join(dir, "server"), "--listen", "127.0.0.1:0",
			"--creators", key, "--p2p=false"}, out, io.Discard)
	}()
	var url string
	for url == "" {
		select {
		case code := <-done:
			t.Fatalf("the server exited (%d): %s", code, out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if i := strings.Index(out.String(), "explorer: "); i >= 0 && strings.Contains(out.String()[i:], "\n") {
			url = strings.TrimSuffix(strings.Fields(out.String()[i:])[1], "/")
		}
	}
	if _, errs, code := psyche(t, "init-coordinator", "--server", url, "--key", key, "--run-id", "hist"); code != 0 {
		t.Fatal(errs)
	}
	// The explorer lists the run at its next refresh; until then the run is
	// not found. The deadline guards against a hang, not a slow machine.
	var got string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		o, errs, code := psyche(t, "status", "--server", url, "--run-id", "hist", "--history")
		if code == 0 {
			got = o
			break
		}
		if time.Now().After(deadline) || !strings.Contains(errs, "404") {
			t.Fatalf("status --history: %d %s", code, errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.HasPrefix(got, "step,epoch,loss,held_out,tokens_per_sec,bytes_sent,witnesses,quorum,trainers\n") {
		t.Fatalf("status --history: %q", got)
	}
	if fi, err := os.Stat(filepath.Join(dir, "server", "history")); err != nil || !fi.IsDir() {
		t.Fatalf("the server keeps no history directory: %v", err)
	}
	if _, errs, code := psyche(t, "status", "--rpc", "http://127.0.0.1:1", "--run-id", "hist", "--history"); code == 0 || !strings.Contains(errs, "--explorer") {
		t.Fatalf("status --history of a Solana run without --explorer: %d %s", code, errs)
	}
	cancel()
	<-done
}
