package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/s3test"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/store"
)

// TestRunFileDataForms: every form of model.data is checked by update
// (a typo fails there, not in every trainer) and gets its kind.
func TestRunFileDataForms(t *testing.T) {
	tiny, err := os.ReadFile(filepath.Join("..", "..", "examples", "tiny-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		data, err string
		kind      coordinator.DataKind
	}{
		{data: "server:tokens/shard0.bin", kind: coordinator.DataHTTP},
		{data: "s3://tokens/run/train.bin", kind: coordinator.DataHTTP},
		{data: "https://example.com/train.bin", kind: coordinator.DataHTTP},
		{data: "/srv/train.bin", kind: coordinator.DataLocal},
		{data: "builtin:opticks", kind: coordinator.DataLocal},
		{data: "server:../etc/passwd", err: `model.data = "server:../etc/passwd": path "../etc/passwd" has an empty, "." or ".." element`},
		{data: "server:/etc/passwd", err: "is absolute"},
		{data: "server:.env", err: "hidden"},
		{data: "s3://tokens", err: "names a bucket, not a token file"},
		{data: "s3://Tokens/x", err: "may hold only a-z"},
		{data: "gs://tokens/x", err: `unsupported scheme "gs"`},
	} {
		content := strings.Replace(string(tiny), `data = "builtin:opticks"`, fmt.Sprintf("data = %q", tc.data), 1)
		path := filepath.Join(dir, "run.toml")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		u, err := loadRunFile(path)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.data, err)
		case tc.err == "" && u.Model.DataKind != tc.kind:
			t.Errorf("%s: kind %v, want %v", tc.data, u.Model.DataKind, tc.kind)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error saying %q", tc.data, err, tc.err)
		}
	}
}

// TestDataFromServerAndBucketAcrossProcesses: two trainers, each its own
// OS process, train a run whose tokens `psyche server --data` serves
// (data = "server:opticks.bin"), then a run whose tokens are an object of
// the S3 test server (data = "s3://…", read with the keys each trainer
// sends only to the endpoint it names). The server refuses a path that
// escapes its data directory, and status says where each run's data is.
func TestDataFromServerAndBucketAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	dir := t.TempDir()
	ctx := context.Background()
	tokens := filepath.Join(dir, "data", "opticks.bin")
	text, err := data.BuiltinText("opticks")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(tokens), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := data.WriteTokenFile(ctx, tokens, data.Tokenize(text), data.TokenSize16); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "secret"), filepath.Join(dir, "data", "link.bin")); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, who := range []string{"admin", "trainer1", "trainer2"} {
		keys[who] = filepath.Join(dir, "keys", who+".json")
		if _, errs, code := psyche(t, "keygen", "--out", keys[who]); code != 0 {
			t.Fatal(errs)
		}
	}
	srv := startProc(t, "server", "server", "--dir", filepath.Join(dir, "server"), "--listen", "127.0.0.1:0",
		"--tick-interval", "200ms", "--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--creators", keys["admin"],
		"--data", filepath.Join(dir, "data"))
	addr := srv.waitLine(t, regexp.MustCompile(`server listening on http://(\S+)`))[1]
	url := "http://" + addr
	for _, target := range []string{"/data/../secret", "/data/%2e%2e/secret", "/data/link.bin"} {
		if status := rawStatus(t, addr, target); status != "400" && status != "404" {
			t.Errorf("GET %s: %s, want 400 or 404", target, status)
		}
	}

	s3 := s3test.Start(t)
	s3.Bucket(t, "tokens")
	// Put through the S3 API (as s3://tokens/d/opticks.bin), as a run
	// creator uploads it.
	bucket, err := store.Open(store.Config{URL: "s3://tokens", Endpoint: s3.Endpoint},
		store.WithStaticCredentials(s3test.AccessKey, s3test.SecretKey), store.WithAccess(store.Access{Endpoint: s3.Endpoint}))
	if err != nil {
		t.Fatal(err)
	}
	if err := bucket.Upload(ctx, tokens, "s3://tokens/d"); err != nil {
		t.Fatal(err)
	}

	// The example run for two trainers, with timeouts that only bound
	// waiting (rounds end when their witnesses report).
	tiny, err := os.ReadFile(filepath.Join("..", "..", "examples", "tiny-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	base := strings.NewReplacer("warmup_time = 10", "warmup_time = 600", "cooldown_time = 10", "cooldown_time = 600",
		"max_round_train_time = 20", "max_round_train_time = 600", "epoch_time = 30 ", "epoch_time = 3600 ",
		"round_witness_time = 3", "round_witness_time = 1", "waiting_for_members_extra_time = 2",
		"waiting_for_members_extra_time = 1", "init_min_clients = 3", "init_min_clients = 2", "min_clients = 3", "min_clients = 2").Replace(string(tiny))
	backend := serverclient.New(url, nil)
	for _, tc := range []struct {
		run, data, store string
		env, joinArgs    []string
		status, source   string
	}{
		{run: "srvdata", data: "server:opticks.bin",
			status: "data: server /data/opticks.bin (",
			source: url + "/data/opticks.bin"},
		{run: "s3data", data: "s3://tokens/d/opticks.bin",
			store:    "store = \"s3://tokens/ckpt\"\nendpoint = \"" + s3.Endpoint + "\"\n",
			env:      []string{"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey},
			joinArgs: []string{"--store-endpoint", s3.Endpoint},
			status:   "data: s3://tokens/d/opticks.bin (through the run's store endpoint " + s3.Endpoint + ")",
			source:   "s3://tokens/d/opticks.bin at " + s3.Endpoint},
	} {
		cfg := strings.Replace(base, `data = "builtin:opticks"`, fmt.Sprintf("data = %q", tc.data), 1)
		cfg = strings.Replace(cfg, "[model.checkpoint]\n", "[model.checkpoint]\n"+tc.store, 1)
		runFile := filepath.Join(dir, tc.run+".toml")
		if err := os.WriteFile(runFile, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"init-coordinator"}, {"update", "--config", runFile}, {"set-paused", "--resume"}} {
			if out, errs, code := psyche(t, append(args, "--server", url, "--key", keys["admin"], "--run-id", tc.run)...); code != 0 {
				t.Fatalf("%s %v: %s %s", tc.run, args, out, errs)
			}
		}
		var trainers []*proc
		for _, who := range []string{"trainer1", "trainer2"} {
			args := append([]string{"--log-format", "json", "join", "--server", url, "--key", keys[who], "--run-id", tc.run,
				"--data-dir", filepath.Join(dir, tc.run, who), "--listen", "/ip4/127.0.0.1/tcp/0", "--mdns=false"}, tc.joinArgs...)
			trainers = append(trainers, startProcEnv(t, tc.run+"/"+who, tc.env, args...))
		}
		waitSteps(t, backend, tc.run, 2, trainers)
		for _, p := range trainers {
			p.waitLog(t, "training data opened", func(r map[string]any) bool { return r["source"] == tc.source })
			p.signal(syscall.SIGKILL)
			<-p.done
		}
		out, errs, code := psyche(t, "status", "--server", url, "--run-id", tc.run)
		if code != 0 || !strings.Contains(out, tc.status) {
			t.Errorf("%s: status %d %s %s, want a line starting %q", tc.run, code, out, errs, tc.status)
		}
	}
}

// waitSteps waits until the run has trained n steps (a hang guard bounds
// the wait; steps are events, not times), failing if a trainer exits.
func waitSteps(t *testing.T, b *serverclient.Client, run string, n uint32, trainers []*proc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	snaps, err := b.Subscribe(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan *proc, len(trainers))
	for _, p := range trainers {
		go func() {
			select {
			case <-p.done:
				exited <- p
			case <-ctx.Done():
			}
		}()
	}
	for {
		select {
		case s, ok := <-snaps:
			if !ok {
				t.Fatalf("%s: no %d steps trained (%v)", run, n, ctx.Err())
			}
			if s.State.Progress.Step >= n+1 { // steps count from 1
				return
			}
		case p := <-exited:
			t.Fatalf("%s exited:\n%s", p.name, tail(p.output(), 4000))
		}
	}
}

// rawStatus sends GET target exactly as written and returns the status code.
func rawStatus(t *testing.T, addr, target string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", target); err != nil {
		t.Fatal(err)
	}
	var line [12]byte
	if _, err := io.ReadFull(c, line[:]); err != nil {
		t.Fatal(err)
	}
	return string(line[9:12])
}
