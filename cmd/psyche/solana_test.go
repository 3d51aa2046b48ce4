package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/solana"
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

	b, err := solana.New(solana.WithRPC(rpcURL), solana.WithWebsocket(strings.Replace(rpcURL, "http://", "ws://", 1)))
	if err != nil {
		t.Fatal(err)
	}
	adminFlow(t, b, []string{"--rpc", rpcURL}, "onchain", func(k *chain.Keypair) {
		if err := b.Airdrop(ctx, k.Public(), 5_000_000_000); err != nil {
			t.Fatal(err)
		}
	})
}
