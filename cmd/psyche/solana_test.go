package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/internal/syncbuf"
	"github.com/psyche-go/psyche/programs/validator"
)

// TestAdminFlowOnSolana runs the admin commands against the local validator
// with the real coordinator program, started the way `psyche validator`
// starts it — or against the validator $PSYCHE_TEST_VALIDATOR names
// (validator.EnvValidator: solana-test-validator with the program loaded).
func TestAdminFlowOnSolana(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local validator")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if v, ok, err := validator.FromEnv(); ok {
		if err != nil {
			t.Fatal(err)
		}
		adminFlowOn(ctx, t, v.RPC, v.WebSocket, uniqueRun("onchain"))
		return
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the local validator needs it")
	}
	var out syncbuf.Buffer
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
	adminFlowOn(ctx, t, rpcURL, strings.Replace(rpcURL, "http://", "ws://", 1), "onchain")
}

// adminFlowOn runs adminFlow on the validator at rpcURL and wsURL.
func adminFlowOn(ctx context.Context, t *testing.T, rpcURL, wsURL, runID string) {
	t.Helper()
	b, err := solana.New(solana.WithRPC(rpcURL), solana.WithWebsocket(wsURL))
	if err != nil {
		t.Fatal(err)
	}
	adminFlow(t, b, []string{"--rpc", rpcURL}, runID, func(k *chain.Keypair) {
		if err := b.Airdrop(ctx, k.Public(), 5_000_000_000); err != nil {
			t.Fatal(err)
		}
	})
}

// uniqueRun is base with a random suffix: a run on an attached validator,
// whose ledger outlives the test, so that the test can run again.
func uniqueRun(base string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%x", base, b)
}
