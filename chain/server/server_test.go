package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/chain/serverwire"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/promread"
	"github.com/psyche-go/psyche/internal/quietclock"
)

func newTestServer(t *testing.T, dir string) (*Server, *quietclock.Clock, *httptest.Server) {
	t.Helper()
	clock := quietclock.New(time.Unix(1_700_000_000, 0)) // moved only by the test
	var seed uint64
	s, err := New(dir, WithClock(clock.Now), WithSeeds(func() uint64 { seed++; return seed }))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return s, clock, hs
}

// serveHTTP starts a server with opts over a fresh state directory, behind
// an httptest server closed when the test ends: the start shared by the
// tests that talk to one server over HTTP.
func serveHTTP(t *testing.T, opts ...Option) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return s, hs
}

func TestBackendSuite(t *testing.T) {
	s, clock, hs := newTestServer(t, t.TempDir())
	backendtest.Run(t, "suite", backendtest.Harness{
		Backend: serverclient.New(hs.URL, nil),
		Advance: func(t *testing.T, seconds uint64) {
			for i := uint64(0); i < seconds; i++ {
				clock.Advance(time.Second)
				s.Tick()
			}
		},
	})
}

func post(t *testing.T, url string, body []byte) (int, string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/instructions", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	return resp.StatusCode, b.String()
}

// signer signs requests for one server with sequence numbers base+n, where
// base is the wall clock when it was made (requests must lie within the
// server's window of it).
type signer struct {
	t    *testing.T
	s    *Server
	base uint64
}

func newSigner(t *testing.T, s *Server) *signer {
	return &signer{t: t, s: s, base: uint64(time.Now().UnixNano())}
}

// sign encodes ix for run id as the server binds it now, with sequence
// base+n, signed by from (and co, if not nil).
func (g *signer) sign(id string, n uint64, ix coordinator.Instruction, from, co chain.Signer) []byte {
	g.t.Helper()
	b, f, _ := g.s.Binding(id)
	if f != nil {
		g.t.Fatalf("binding of %q: %s", id, f.Error)
	}
	return g.signFor(b, id, n, ix, from, co)
}

func (g *signer) signFor(b serverwire.Binding, id string, n uint64, ix coordinator.Instruction, from, co chain.Signer) []byte {
	g.t.Helper()
	rid, err := coordinator.ParseRunID(id)
	if err != nil {
		rid = [coordinator.MaxRunIDLen]byte{}
		copy(rid[:], id)
	}
	var req []byte
	if co != nil {
		req, err = serverwire.EncodeRequest(b, rid, g.base+n, coordinator.EncodeInstruction(ix), from, co)
	} else {
		req, err = serverwire.EncodeRequest(b, rid, g.base+n, coordinator.EncodeInstruction(ix), from, nil)
	}
	if err != nil {
		g.t.Fatal(err)
	}
	return req
}

func TestRequestsAreAuthenticatedAndNotReplayable(t *testing.T) {
	s, _, hs := newTestServer(t, t.TempDir())
	g := newSigner(t, s)
	admin := backendtest.Key("admin")
	id, _ := coordinator.ParseRunID("auth")
	req := g.sign("auth", 1, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id}, admin, nil)
	if code, body := post(t, hs.URL, req); code != http.StatusOK {
		t.Fatalf("init: %d %s", code, body)
	}
	k, m := backendtest.TinyConfig(), backendtest.TinyModel()
	update := g.sign("auth", 2, &coordinator.Update{Config: &k, Model: &m}, admin, nil)
	if code, body := post(t, hs.URL, update); code != http.StatusOK {
		t.Fatalf("update: %d %s", code, body)
	}
	// The same bytes again: a replay.
	if code, body := post(t, hs.URL, update); code != http.StatusConflict || !strings.Contains(body, "Replay") {
		t.Fatalf("replay: %d %s", code, body)
	}
	// An older sequence number: also refused.
	old := g.sign("auth", 1, &coordinator.SetPaused{}, admin, nil)
	if code, _ := post(t, hs.URL, old); code != http.StatusConflict {
		t.Fatalf("old sequence: %d", code)
	}
	// A flipped byte in the instruction breaks the signature.
	forged := g.sign("auth", 3, &coordinator.SetPaused{}, admin, nil)
	forged[serverwire.HeaderSize] ^= 1
	if code, _ := post(t, hs.URL, forged); code != http.StatusUnauthorized {
		t.Fatalf("forged: %d", code)
	}
	// Garbage and truncated requests get errors, and the server keeps working.
	for _, b := range [][]byte{nil, []byte("hello"), forged[:40], append(bytes.Clone(update), 0)} {
		if code, _ := post(t, hs.URL, b); code != http.StatusBadRequest && code != http.StatusUnauthorized {
			t.Fatalf("garbage %q...: %d", b[:min(len(b), 8)], code)
		}
	}
	resume := g.sign("auth", 4, &coordinator.SetPaused{}, admin, nil)
	if code, body := post(t, hs.URL, resume); code != http.StatusOK || !strings.Contains(body, "WaitingForMembers") {
		t.Fatalf("resume: %d %s", code, body)
	}
	// A coordinator error keeps its code across the network.
	c := serverclient.New(hs.URL, nil)
	_, err := c.Send(context.Background(), "auth", backendtest.Key("mallory"), nil, &coordinator.SetPaused{Paused: true})
	if !errors.Is(err, coordinator.ErrUnauthorized) {
		t.Fatalf("got %v", err)
	}
	if _, err := c.Send(context.Background(), "nope", admin, nil, &coordinator.Tick{}); !errors.Is(err, chain.ErrRunNotFound) {
		t.Fatalf("missing run: %v", err)
	}
}

func TestJoinAuthorityCoSigns(t *testing.T) {
	_, _, hs := newTestServer(t, t.TempDir())
	c := serverclient.New(hs.URL, nil)
	ctx := context.Background()
	admin, gate, alice := backendtest.Key("admin"), backendtest.Key("gate"), backendtest.Key("alice")
	id, _ := coordinator.ParseRunID("gated")
	steps := []coordinator.Instruction{&coordinator.InitCoordinator{MainAuthority: admin.Public(), JoinAuthority: gate.Public(), RunID: id}}
	k, m := backendtest.TinyConfig(), backendtest.TinyModel()
	steps = append(steps, &coordinator.Update{Config: &k, Model: &m}, &coordinator.SetPaused{})
	for _, ix := range steps {
		if _, err := c.Send(ctx, "gated", admin, nil, ix); err != nil {
			t.Fatal(err)
		}
	}
	join := &coordinator.JoinRun{ID: coordinator.ClientID{Signer: alice.Public(), P2P: coordinator.Pubkey{1}}}
	if _, err := c.Send(ctx, "gated", alice, nil, join); !errors.Is(err, coordinator.ErrJoinNotAuthorized) {
		t.Fatalf("join without the co-signature: %v", err)
	}
	if _, err := c.Send(ctx, "gated", alice, gate, join); err != nil {
		t.Fatalf("co-signed join: %v", err)
	}
}

// TestRestartLosesNothing runs the server as a separate process, kills it
// with SIGKILL after a series of acknowledged instructions and ticks, and
// checks that a new process on the same directory has exactly the last
// acknowledged state.
func TestRestartLosesNothing(t *testing.T) {
	dir := t.TempDir()
	url, kill := startChild(t, dir)
	c := serverclient.New(url, nil)
	ctx := context.Background()
	admin := backendtest.Key("admin")
	backendtest.CreateTinyRun(ctx, t, c, "durable", admin)
	var last uint64
	for i := 0; i < 4; i++ { // the tiny config takes 4 joiners
		who := backendtest.Key(fmt.Sprintf("client%d", i))
		r, err := c.Send(ctx, "durable", who, nil, &coordinator.JoinRun{ID: coordinator.ClientID{Signer: who.Public(), P2P: coordinator.Pubkey{byte(i + 1)}}})
		if err != nil {
			t.Fatal(err)
		}
		last = r.Nonce
	}
	before, err := c.Snapshot(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	kill()
	url, kill = startChild(t, dir)
	defer kill()
	after, err := serverclient.New(url, nil).Snapshot(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	if after.Nonce() < last || after.State.PendingLen != 4 {
		t.Fatalf("after a kill -9: %s (acknowledged nonce %d)", after.State.Describe(), last)
	}
	// Nothing ticks the child: the state after the restart is the last
	// one acknowledged, byte for byte.
	if !bytes.Equal(after.State.MarshalAccount(), before.State.MarshalAccount()) {
		t.Fatalf("the restarted server holds %s, before the kill %s", after.State.Describe(), before.State.Describe())
	}
}

const (
	childEnv         = "PSYCHE_SERVER_TEST_CHILD"
	childCreatorsEnv = "PSYCHE_SERVER_TEST_CREATORS" // hex of the one key that may create runs (default: any)
	childListenEnv   = "PSYCHE_SERVER_TEST_LISTEN"   // the address the child listens on (default: 127.0.0.1:0)
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		// The child does not tick on its own: what a restart must keep is
		// exactly what was acknowledged, and a tick racing the kill would
		// move the run on (four joiners start an epoch) while the test
		// compares states.
		opts := []Option{WithManualTicks()}
		if hexKey := os.Getenv(childCreatorsEnv); hexKey != "" {
			var k coordinator.Pubkey
			if _, err := hex.Decode(k[:], []byte(hexKey)); err != nil {
				fmt.Println("error:", err)
				os.Exit(1)
			}
			opts = append(opts, WithCreators(k))
		}
		s, err := New(dir, opts...)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		l, err := listenLocal()
		if addr := os.Getenv(childListenEnv); addr != "" {
			l, err = net.Listen("tcp", addr) // [::1]:0 (BenchmarkServerFloodIPv6)
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Printf("listening http://%s\n", l.Addr())
		_ = s.Serve(context.Background(), l)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startChild runs this test binary as a server on dir and returns its URL and
// a function that SIGKILLs it.
func startChild(t testing.TB, dir string, env ...string) (string, func()) {
	url, _, kill := startChildProc(t, dir, env...)
	return url, kill
}

// startChildProc is startChild that also returns the child's process id.
func startChildProc(t testing.TB, dir string, env ...string) (string, int, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+dir), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening ") {
		_ = cmd.Process.Kill()
		t.Fatalf("child server: %q %v", line, err)
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}
	t.Cleanup(kill)
	return strings.TrimSpace(strings.TrimPrefix(line, "listening ")), cmd.Process.Pid, kill
}

// TestMetrics: requests are counted by instruction and outcome, runs and
// open streams as gauges, and the registry exports them.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	s, hs := serveHTTP(t, WithMetrics(m))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // before hs.Close, which waits for the stream to end
	admin := backendtest.Key("admin")
	id, _ := coordinator.ParseRunID("counted")
	req := newSigner(t, s).sign("counted", 1, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id}, admin, nil)
	for range 2 { // the second finds the run there
		post(t, hs.URL, req)
	}
	post(t, hs.URL, []byte("not a request"))
	stream, err := serverclient.New(hs.URL, nil).Subscribe(ctx, "counted")
	if err != nil {
		t.Fatal(err)
	}
	<-stream // the stream is open once its first snapshot arrived
	for _, tt := range []struct {
		name  string
		value float64
	}{
		{"init_coordinator ok", promread.Value(m.Requests.WithLabelValues("init_coordinator", "ok"))},
		{"init_coordinator AlreadyInitialized", promread.Value(m.Requests.WithLabelValues("init_coordinator", "AlreadyInitialized"))},
		{"? BadRequest", promread.Value(m.Requests.WithLabelValues("?", "BadRequest"))},
		{"runs", promread.Value(m.Runs)},
		{"subscribers", promread.Value(m.Subscribers)},
	} {
		if tt.value != 1 {
			t.Errorf("%s = %v, want 1", tt.name, tt.value)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, want := range []string{"psyche_server_requests_total", "psyche_server_runs", "psyche_server_subscribers"} {
		if !names[want] {
			t.Errorf("the registry does not export %s", want)
		}
	}
}

// p2pRecorder is the server's view of a p2p host: what it was told.
type p2pRecorder struct {
	mu   sync.Mutex
	runs []map[string][]coordinator.Pubkey
}

func (r *p2pRecorder) Addrs() []string {
	return []string{"/ip4/127.0.0.1/tcp/7601/p2p/12D3KooWExample"}
}
func (r *p2pRecorder) Relay() bool { return true }
func (r *p2pRecorder) SetRuns(runs map[string][]coordinator.Pubkey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, runs)
}
func (r *p2pRecorder) last() map[string][]coordinator.Pubkey {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.runs) == 0 {
		return nil
	}
	return r.runs[len(r.runs)-1]
}

// The server publishes its p2p host at /v1/p2p and tells it every run and
// its members (joiners included) as they change; a server without one says
// so.
func TestP2PHost(t *testing.T) {
	rec := &p2pRecorder{}
	_, hs := serveHTTP(t, WithP2P(rec))
	c := serverclient.New(hs.URL, nil)
	ctx := context.Background()
	info, err := c.P2PBootstrap(ctx)
	if err != nil || len(info.Addrs) != 1 || len(info.Relays) != 1 {
		t.Fatalf("P2PBootstrap = %+v, %v", info, err)
	}
	admin, alice := backendtest.Key("admin"), backendtest.Key("alice")
	backendtest.CreateTinyRun(ctx, t, c, "p2p", admin)
	if got := rec.last(); got == nil || len(got["p2p"]) != 0 {
		t.Fatalf("after init: %v, want the run with no members", got)
	}
	p2pKey := coordinator.Pubkey{7}
	if _, err := c.Send(ctx, "p2p", alice, nil, &coordinator.JoinRun{ID: coordinator.ClientID{Signer: alice.Public(), P2P: p2pKey}}); err != nil {
		t.Fatal(err)
	}
	if got := rec.last()["p2p"]; len(got) != 1 || got[0] != p2pKey {
		t.Fatalf("after a join: %v, want the joiner's p2p key", got)
	}
	for _, ix := range []coordinator.Instruction{&coordinator.SetPaused{Paused: true}, &coordinator.FreeCoordinator{}} {
		if _, err := c.Send(ctx, "p2p", admin, nil, ix); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := rec.last()["p2p"]; ok {
		t.Error("a freed run is still served")
	}

	_, _, plain := newTestServer(t, t.TempDir())
	if _, err := serverclient.New(plain.URL, nil).P2PBootstrap(ctx); !errors.Is(err, chain.ErrNoP2P) {
		t.Errorf("a server without a p2p host: %v, want ErrNoP2P", err)
	}
}

// TestTicksWhenDue checks the ticker's schedule: with nothing due it sleeps
// the whole interval; an instruction that changes a run wakes it; once a
// transition has a deadline, it sleeps exactly until that second.
func TestTicksWhenDue(t *testing.T) {
	clock := quietclock.New(time.Unix(1_700_000_000, 250_000_000))
	s, hs := serveHTTP(t, WithClock(clock.Now), WithTickInterval(time.Hour))
	c := serverclient.New(hs.URL, nil)
	ctx := context.Background()
	admin := backendtest.Key("admin")
	backendtest.CreateTinyRun(ctx, t, c, "due", admin)
	k := backendtest.TinyConfig()
	if got := s.untilDue(); got != time.Hour {
		t.Fatalf("waiting for members, none pending: sleeps %v, want the interval", got)
	}
	<-s.changed // the instructions above woke it
	for i := 0; i < int(k.InitMinClients); i++ {
		who := backendtest.Key(fmt.Sprintf("client%d", i))
		if _, err := c.Send(ctx, "due", who, nil, &coordinator.JoinRun{ID: coordinator.ClientID{Signer: who.Public(), P2P: coordinator.Pubkey{byte(i + 1)}}}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-s.changed:
	default:
		t.Fatal("a join did not wake the ticker")
	}
	// Enough joiners: due when waiting_for_members_extra_time has passed
	// since the state began (a whole second, 1_700_000_000).
	want := time.Unix(1_700_000_000+int64(max(k.WaitingForMembersExtraTime, 1)), 0).Sub(clock.Now())
	if got := s.untilDue(); got != want {
		t.Fatalf("sleeps %v, want %v (until the warmup is due)", got, want)
	}
	clock.Advance(want)
	s.Tick()
	if snap, err := c.Snapshot(ctx, "due"); err != nil || snap.State.RunState != coordinator.Warmup {
		t.Fatalf("the tick at the due second did not start the warmup: %v %v", snap, err)
	}
}
