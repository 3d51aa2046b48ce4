package validator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/internal/soltest"
)

// TestAttach attaches to a validator on wall time through the environment
// variable, as the Solana tests do with solana-test-validator: the URLs
// follow Solana's convention, SetClock waits for the chain's clock instead
// of moving it, and Close leaves the validator running.
func TestAttach(t *testing.T) {
	t.Setenv(EnvValidator, "")
	if _, ok, _ := FromEnv(); ok {
		t.Fatalf("FromEnv with $%s empty: ok", EnvValidator)
	}
	if _, err := lookNode(); err != nil {
		t.Skip("node is not on PATH: the local validator needs Node 20 or newer (apt-get install nodejs npm)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	wall, err := Start(ctx, WithSlotDuration(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer wall.Close()

	t.Setenv(EnvValidator, wall.RPC)
	v, ok, err := FromEnv()
	if !ok || err != nil {
		t.Fatalf("FromEnv: %v, %v", ok, err)
	}
	if !v.Attached() || wall.Attached() || v.RPC != wall.RPC || v.WebSocket != wall.WebSocket {
		t.Fatalf("attached %+v to %+v: want the same URLs (the websocket on the RPC port + 1)", v, wall)
	}
	ws, err := dialWS(v.WebSocket, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ws.Close()

	now, err := v.ClockTime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	target := now.Add(2 * time.Second)
	if err := v.SetClock(ctx, target); err != nil {
		t.Fatal(err)
	}
	if after, err := v.ClockTime(ctx); err != nil || after.Before(target) {
		t.Fatalf("SetClock(%d) returned with the chain clock at %d (%v)", target.Unix(), after.Unix(), err)
	}
	// A validator started here refuses, rather than waits.
	if err := wall.SetClock(ctx, target.Add(time.Hour)); err == nil || !strings.Contains(err.Error(), "--manual-clock") {
		t.Fatalf("SetClock on a wall-time validator this process started: %v, want a refusal", err)
	}
	// A deadline bounds the wait.
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if err := v.SetClock(short, target.Add(time.Hour)); err == nil {
		t.Fatal("SetClock an hour ahead returned within 50ms")
	}

	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	rpc := &soltest.RPC{URL: wall.RPC}
	if got := rpc.Call(t, "getHealth"); string(got) != `"ok"` {
		t.Fatalf("after closing the attached handle: getHealth = %s", got)
	}
	select {
	case <-wall.Done():
		t.Fatal("closing the attached handle stopped the validator")
	default:
	}
}
