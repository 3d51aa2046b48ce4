package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/coordinator"
)

// TestAdminFlowOnSolana runs the admin commands against the local validator
// with the real coordinator program, started the way `psyche validator`
// starts it.
func TestAdminFlowOnSolana(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local validator")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the local validator needs it")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runContext(ctx, []string{"psyche", "--log-level", "warn", "validator", "--port", "0"}, &out, &out)
	}()
	var rpcURL string
	deadline := time.Now().Add(60 * time.Second)
	for rpcURL == "" {
		for _, line := range strings.Split(out.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "validator: rpc "); ok {
				rpcURL = strings.Fields(rest)[0]
				rpcURL = strings.TrimSuffix(rpcURL, ",")
			}
		}
		select {
		case code := <-done:
			t.Fatalf("validator exited (%d): %s", code, out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the validator did not start: %s", out.String())
		}
	}
	defer func() { cancel(); <-done }()

	dir := t.TempDir()
	keys := map[string]string{}
	b, err := solana.New(solana.WithRPC(rpcURL), solana.WithWebsocket(strings.Replace(rpcURL, "http://", "ws://", 1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"admin", "alice", "bob"} {
		keys[name] = filepath.Join(dir, name+".json")
		if _, errs, code := psyche(t, "keygen", "--out", keys[name]); code != 0 {
			t.Fatal(errs)
		}
		k, err := chain.LoadKeypair(keys[name])
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Airdrop(ctx, k.Public(), 5_000_000_000); err != nil {
			t.Fatal(err)
		}
	}
	as := func(who string, args ...string) (string, string, int) {
		return psyche(t, append(args, "--rpc", rpcURL, "--key", keys[who], "--run-id", "onchain")...)
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
	if _, errs, code := as("alice", "set-paused", "--resume"); code == 0 || !strings.Contains(errs, "main authority") {
		t.Fatalf("resume by alice: %d %s", code, errs)
	}
	if out, errs, code := as("admin", "set-paused", "--resume"); code != 0 || !strings.Contains(out, "WaitingForMembers") {
		t.Fatalf("resume: %d %s %s", code, out, errs)
	}
	var joined []string
	for i, name := range []string{"alice", "bob"} {
		k, _ := chain.LoadKeypair(keys[name])
		if _, err := b.Send(ctx, "onchain", k, nil, &coordinator.JoinRun{ID: coordinator.ClientID{Signer: k.Public(), P2P: coordinator.Pubkey{byte(9 + i)}}}); err != nil {
			t.Fatal(err)
		}
		joined = append(joined, chain.Address(k.Public()))
	}
	if out, errs, code := as("alice", "tick"); code != 0 || !strings.Contains(out, "tick:") {
		t.Fatalf("tick: %d %s %s", code, out, errs)
	}
	var buf bytes.Buffer
	outS, errs, code := psyche(t, "status", "--rpc", rpcURL, "--run-id", "onchain", "--json")
	if code != 0 {
		t.Fatalf("status: %d %s", code, errs)
	}
	buf.WriteString(outS)
	var v statusView
	if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, outS)
	}
	if v.State != "WaitingForMembers" || !slices.Equal(v.Pending, joined) {
		t.Fatalf("status: %+v", v)
	}
}
