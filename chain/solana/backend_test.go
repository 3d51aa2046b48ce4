package solana_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	sol "github.com/gagliardetto/solana-go"
	"github.com/gagliardetto/solana-go/rpc"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/coordinator"
	program "github.com/psyche-go/psyche/programs/coordinator"
	"github.com/psyche-go/psyche/programs/validator"
)

// startValidator runs the local validator (litesvm) with the coordinator
// program preloaded at solana.LocalProgramID, or attaches to the validator
// $PSYCHE_TEST_VALIDATOR names (solana-test-validator with the program at
// that id: see validator.EnvValidator), where opts do not apply.
func startValidator(t *testing.T, opts ...validator.Option) *validator.Validator {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a local validator")
	}
	if v, ok, err := validator.FromEnv(); ok {
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("using the validator at %s (websocket %s) from $%s", v.RPC, v.WebSocket, validator.EnvValidator)
		return v
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the local validator needs it")
	}
	so := filepath.Join(t.TempDir(), "coordinator.so")
	if err := os.WriteFile(so, program.Program, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	v, err := validator.Start(ctx, append(opts, validator.WithProgram(solana.LocalProgramID.String(), so))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	return v
}

// runName is base on the local validator, which starts with an empty
// ledger every time; on an attached one, whose ledger outlives the test,
// base with a random suffix, so that the test can run again.
func runName(t *testing.T, v *validator.Validator, base string) string {
	if !v.Attached() {
		return base
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%x", base, b)
}

func newBackend(t *testing.T, v *validator.Validator) *solana.Backend {
	b, err := solana.New(solana.WithRPC(v.RPC), solana.WithWebsocket(v.WebSocket))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chainTime reads the Clock sysvar's unix timestamp.
func chainTime(t *testing.T, v *validator.Validator) int64 {
	res, err := rpc.New(v.RPC).GetAccountInfo(context.Background(), sol.SysVarClockPubkey)
	if err != nil {
		t.Fatal(err)
	}
	return int64(binary.LittleEndian.Uint64(res.Value.Data.GetBinary()[32:40]))
}

func TestBackendSuite(t *testing.T) {
	// The suite's clock is the chain's, moved by the test: no waiting.
	backendSuite(t, startValidator(t, validator.WithManualClock()))
}

// TestBackendSuiteAttached runs the suite the way it runs against
// solana-test-validator ($PSYCHE_TEST_VALIDATOR): attached to a validator
// this test does not control, whose clock follows wall time, so Advance
// waits for the chain's clock. (With the variable set, TestBackendSuite
// already does this.)
func TestBackendSuiteAttached(t *testing.T) {
	if _, ok, _ := validator.FromEnv(); ok {
		t.Skipf("$%s is set: TestBackendSuite runs attached", validator.EnvValidator)
	}
	wall := startValidator(t, validator.WithSlotDuration(50*time.Millisecond))
	v, err := validator.Attach(wall.RPC, wall.WebSocket)
	if err != nil {
		t.Fatal(err)
	}
	backendSuite(t, v)
}

func backendSuite(t *testing.T, v *validator.Validator) {
	b := newBackend(t, v)
	ctx := context.Background()
	for _, name := range []string{"admin", "alice", "bob", "ticker"} {
		if err := b.Airdrop(ctx, backendtest.Key(name).Public(), 10_000_000_000); err != nil {
			t.Fatal(err)
		}
	}
	run := runName(t, v, "solana-suite")
	backendtest.Run(t, run, backendtest.Harness{
		Backend: b,
		Advance: func(t *testing.T, seconds uint64) {
			// Move the chain's clock (an attached validator's can only be
			// waited for), then tick: on chain, someone has to.
			target := chainTime(t, v) + int64(seconds)
			wait, cancel := context.WithTimeout(ctx, time.Duration(seconds)*time.Second+time.Minute)
			defer cancel()
			if err := v.SetClock(wait, time.Unix(target, 0)); err != nil {
				t.Fatal(err)
			}
			if got := chainTime(t, v); got < target || (!v.Attached() && got != target) {
				t.Fatalf("the chain clock reads %d after SetClock(%d)", got, target)
			}
			if _, err := b.Send(ctx, run, backendtest.Key("ticker"), nil, &coordinator.Tick{}); err != nil {
				t.Fatal(err)
			}
		},
	})
}

func TestErrors(t *testing.T) {
	v := startValidator(t)
	b := newBackend(t, v)
	ctx := context.Background()
	poor := backendtest.Key("poor")
	id, _ := coordinator.ParseRunID("poor")
	if _, err := b.Send(ctx, "poor", poor, nil, &coordinator.InitCoordinator{MainAuthority: poor.Public(), RunID: id}); !errors.Is(err, solana.ErrInsufficient) {
		t.Fatalf("init by a key without lamports: %v", err)
	}
	// Enough for the fee, not for the coordinator account's rent.
	little := backendtest.Key("little")
	if err := b.Airdrop(ctx, little.Public(), 1_000_000); err != nil {
		t.Fatal(err)
	}
	id2, _ := coordinator.ParseRunID("little")
	if _, err := b.Send(ctx, "little", little, nil, &coordinator.InitCoordinator{MainAuthority: little.Public(), RunID: id2}); !errors.Is(err, solana.ErrInsufficient) {
		t.Fatalf("init without the rent: %v", err)
	}
	if _, err := b.Snapshot(ctx, "nothing-here"); !errors.Is(err, chain.ErrRunNotFound) {
		t.Fatalf("snapshot of a missing run: %v", err)
	}
	down, err := solana.New(solana.WithRPC("http://127.0.0.1:1"), solana.WithWebsocket("ws://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := down.Snapshot(ctx, "x"); !errors.Is(err, solana.ErrRPCDown) {
		t.Fatalf("with the RPC down: %v", err)
	}
}

// proxy forwards TCP connections to target and can cut them all, to drop a
// websocket under a live subscription.
type proxy struct {
	l      net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	target string
}

func newProxy(t *testing.T, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target}
	t.Cleanup(func() { l.Close(); p.cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// subscribedRun creates a run (named for tag) with a funded admin (named
// adminName) and subscribes to it.
func subscribedRun(ctx context.Context, t *testing.T, v *validator.Validator, b *solana.Backend, adminName, tag string) (*chain.Keypair, string, <-chan chain.Snapshot) {
	t.Helper()
	admin := backendtest.Key(adminName)
	if err := b.Airdrop(ctx, admin.Public(), 10_000_000_000); err != nil {
		t.Fatal(err)
	}
	run := runName(t, v, tag)
	id, _ := coordinator.ParseRunID(run)
	if _, err := b.Send(ctx, run, admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id}); err != nil {
		t.Fatal(err)
	}
	snaps, err := b.Subscribe(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	return admin, run, snaps
}

// TestWebsocketDropIsRecovered cuts the subscription's connection: the
// backend reconnects, resubscribes and resyncs, and later changes still
// arrive in nonce order.
func TestWebsocketDropIsRecovered(t *testing.T) {
	v := startValidator(t)
	u, _ := url.Parse(v.WebSocket)
	p := newProxy(t, u.Host)
	b, err := solana.New(solana.WithRPC(v.RPC), solana.WithWebsocket("ws://"+p.l.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, run, snaps := subscribedRun(ctx, t, v, b, "ws-admin", "ws")
	first := <-snaps
	rename := func(name string) uint64 {
		var m coordinator.Metadata
		_ = coordinator.SetFixedString(m.Name[:], name)
		r, err := b.Send(ctx, run, admin, nil, &coordinator.Update{Metadata: &m})
		if err != nil {
			t.Fatal(err)
		}
		return r.Nonce
	}
	want := rename("before the drop")
	for s := range snaps {
		if s.Nonce() >= want {
			break
		}
	}
	p.cut()
	want = rename("after the drop")
	for s := range snaps {
		if s.Nonce() <= first.Nonce() {
			t.Fatalf("snapshot went back to nonce %d", s.Nonce())
		}
		if s.Nonce() >= want {
			if got := coordinator.FixedString(s.State.Metadata.Name[:]); got != "after the drop" {
				t.Fatalf("name %q", got)
			}
			return
		}
	}
	t.Fatal("the subscription ended")
}

func TestWebsocketFor(t *testing.T) {
	for rpcURL, want := range map[string]string{
		"http://127.0.0.1:8899":           "ws://127.0.0.1:8900",
		"https://rpc.example.com:443/x?y": "wss://rpc.example.com:444/x?y",
		"https://api.devnet.solana.com":   "wss://api.devnet.solana.com",
		"http://[::1]:8899":               "ws://[::1]:8900",
	} {
		if got, err := solana.WebsocketFor(rpcURL); err != nil || got != want {
			t.Errorf("WebsocketFor(%q) = %q, %v; want %q", rpcURL, got, err, want)
		}
	}
	for _, bad := range []string{"ftp://x", "http://x:65535", "::"} {
		if got, err := solana.WebsocketFor(bad); err == nil {
			t.Errorf("WebsocketFor(%q) = %q, want an error", bad, got)
		}
	}
}

// warnings counts the records at warning level or above.
type warnings struct {
	mu sync.Mutex
	n  int
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.mu.Lock()
		w.n++
		w.mu.Unlock()
	}
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// TestSubscriptionEndsWhenFreed frees a run under a live subscription: the
// closed account's notification (a default account, as Agave sends it) ends
// the subscription as "run gone", without a broken stream and a reconnect.
func TestSubscriptionEndsWhenFreed(t *testing.T) {
	v := startValidator(t)
	warns := &warnings{}
	b, err := solana.New(solana.WithRPC(v.RPC), solana.WithWebsocket(v.WebSocket), solana.WithLogger(slog.New(warns)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, run, snaps := subscribedRun(ctx, t, v, b, "free-admin", "freed")
	<-snaps
	// The subscription may not be live yet: a metadata change observed
	// through it proves it is.
	var m coordinator.Metadata
	_ = coordinator.SetFixedString(m.Name[:], "live")
	r, err := b.Send(ctx, run, admin, nil, &coordinator.Update{Metadata: &m})
	if err != nil {
		t.Fatal(err)
	}
	for s := range snaps {
		if s.Nonce() >= r.Nonce {
			break
		}
	}
	if _, err := b.Send(ctx, run, admin, nil, &coordinator.FreeCoordinator{}); err != nil {
		t.Fatal(err)
	}
	for range snaps {
	}
	if ctx.Err() != nil {
		t.Fatal("the subscription outlived the run")
	}
	warns.mu.Lock()
	defer warns.mu.Unlock()
	if warns.n != 0 {
		t.Fatalf("%d warnings: the stream broke instead of ending", warns.n)
	}
}

// TestRepeatedInstructionAndRecreatedRun covers what the backend remembers
// between sends: a reused blockhash must not turn the same instruction sent
// twice by the same signer into one transaction (identical message, identical
// signature), a run freed and created again under its id has a new
// coordinator account that the next send must find, and a refused tick or
// witness report still comes back as the coordinator's error.
func TestRepeatedInstructionAndRecreatedRun(t *testing.T) {
	v := startValidator(t)
	b := newBackend(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := backendtest.Key("repeat-admin")
	if err := b.Airdrop(ctx, admin.Public(), 10_000_000_000); err != nil {
		t.Fatal(err)
	}
	run := runName(t, v, "repeat")
	id, _ := coordinator.ParseRunID(run)
	var m coordinator.Metadata
	_ = coordinator.SetFixedString(m.Name[:], "same")
	for round := range 2 {
		if _, err := b.Send(ctx, run, admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id}); err != nil {
			t.Fatalf("init %d: %v", round, err)
		}
		var last uint64
		for i := range 3 {
			r, err := b.Send(ctx, run, admin, nil, &coordinator.Update{Metadata: &m})
			if err != nil {
				t.Fatalf("run %d, update %d: %v", round, i, err)
			}
			if r.Nonce <= last {
				t.Fatalf("run %d, update %d: nonce %d after %d: the update did not execute", round, i, r.Nonce, last)
			}
			last = r.Nonce
		}
		// Refusals come back as the coordinator's errors.
		var ce *coordinator.Error
		if _, err := b.Send(ctx, run, admin, nil, &coordinator.Tick{}); !errors.Is(err, coordinator.ErrHalted) {
			t.Fatalf("run %d: a tick on a halted run: %v", round, err)
		}
		if _, err := b.Send(ctx, run, admin, nil, &coordinator.WitnessRound{}); !errors.As(err, &ce) {
			t.Fatalf("run %d: a witness report of no client: %v, not a coordinator error", round, err)
		}
		if _, err := b.Send(ctx, run, admin, nil, &coordinator.FreeCoordinator{}); err != nil {
			t.Fatal(err)
		}
	}
}
