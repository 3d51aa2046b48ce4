package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/chain/serverwire"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/promread"
)

// fingerprint is everything a server stores: every file in its directory
// and, per run, the replay table it serves from memory.
func fingerprint(t *testing.T, s *Server) string {
	t.Helper()
	var b strings.Builder
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %x\n", e.Name(), sha256.Sum256(data))
	}
	// The server's lock order: a run's mutex, then the server's (freeRun).
	for _, id := range s.Runs() {
		r := s.run(id)
		r.mu.Lock()
		fmt.Fprintf(&b, "run %s inc=%d floor=%d entries=%d nonce=%d\n", id, r.incarnation, r.replay.floor, len(r.replay.seqs), r.state.Nonce)
		r.mu.Unlock()
	}
	s.mu.Lock()
	fmt.Fprintf(&b, "freed=%v owned=%v\n", s.freed, s.owned)
	s.mu.Unlock()
	return b.String()
}

func (g *signer) signAt(b serverwire.Binding, id string, seq uint64, ix coordinator.Instruction, from, co chain.Signer) []byte {
	g.t.Helper()
	saved := g.base
	g.base = 0
	defer func() { g.base = saved }()
	return g.signFor(b, id, seq, ix, from, co)
}

// TestRefusals: every way a request is refused has its HTTP status and
// name, and a refused request stores nothing, in memory or on disk.
func TestRefusals(t *testing.T) {
	admin, carol, mallory := backendtest.Key("admin"), backendtest.Key("carol"), backendtest.Key("mallory")
	s, hs := serveHTTP(t, WithCreators(admin.Public(), carol.Public()), WithCreatorQuota(1), WithRequestWindow(time.Minute))
	g := newSigner(t, s)
	rid, _ := coordinator.ParseRunID("r")
	k, m := backendtest.TinyConfig(), backendtest.TinyModel()
	resume := g.sign("r", 3, &coordinator.SetPaused{}, admin, nil)
	for _, req := range [][]byte{
		g.sign("r", 1, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}, admin, nil),
		g.sign("r", 2, &coordinator.Update{Config: &k, Model: &m}, admin, nil),
		resume,
	} {
		if code, body := post(t, hs.URL, req); code != http.StatusOK {
			t.Fatalf("setting up: %d %s", code, body)
		}
	}
	bind, _, _ := s.Binding("r")
	now := uint64(time.Now().UnixNano())
	initFor := func(id string, main chain.Signer) coordinator.Instruction {
		var r [coordinator.MaxRunIDLen]byte
		copy(r[:], id)
		return &coordinator.InitCoordinator{MainAuthority: main.Public(), RunID: r}
	}
	forged := g.sign("r", 10, &coordinator.SetPaused{Paused: true}, admin, nil)
	forged[serverwire.HeaderSize] ^= 1
	for _, tt := range []struct {
		name   string
		req    []byte
		status int
		want   string // the failure's name
		says   string // in its message
	}{
		{"garbage", []byte("hello"), http.StatusBadRequest, "BadRequest", "malformed"},
		{"old version", append([]byte("PSRQ\x01"), make([]byte, 200)...), http.StatusBadRequest, "BadRequest", "malformed"},
		{"bad signature", forged, http.StatusUnauthorized, "BadSignature", "signature 0"},
		{"another server", g.signFor(serverwire.Binding{Server: [32]byte{9}, Incarnation: 1}, "r", 11, &coordinator.SetPaused{Paused: true}, admin, nil), http.StatusConflict, "Stale", "signed for server 09"},
		{"another incarnation", g.signFor(serverwire.Binding{Server: s.ID(), Incarnation: 2}, "r", 12, &coordinator.SetPaused{Paused: true}, admin, nil), http.StatusConflict, "Stale", "incarnation 2"},
		{"sequence too old", g.signAt(bind, "r", now-uint64(2*time.Minute), &coordinator.SetPaused{Paused: true}, admin, nil), http.StatusConflict, "Stale", "window"},
		{"sequence too far ahead", g.signAt(bind, "r", now+uint64(2*time.Minute), &coordinator.SetPaused{Paused: true}, admin, nil), http.StatusConflict, "Stale", "window"},
		{"replay", resume, http.StatusConflict, "Replay", "already used"},
		{"older sequence", g.sign("r", 2, &coordinator.SetPaused{Paused: true}, admin, nil), http.StatusConflict, "Replay", "already used"},
		{"run id starting with a dot", g.signFor(bind, ".hidden", 13, initFor(".hidden", admin), admin, nil), http.StatusBadRequest, "InvalidRunID", `".hidden" starts with "."`},
		{"non-canonical run id", g.signFor(bind, "r\x00x", 14, &coordinator.Tick{}, admin, nil), http.StatusBadRequest, "InvalidRunID", "zero padding"},
		{"init signed by another key", g.sign("c", 15, initFor("c", admin), carol, nil), http.StatusForbidden, "NotMainAuthority", carol.Public().String()},
		{"init by a key that may not create", g.sign("m", 16, initFor("m", mallory), mallory, nil), http.StatusForbidden, "NotCreator", mallory.Public().String()},
		{"init over the quota", g.sign("r2", 17, initFor("r2", admin), admin, nil), http.StatusForbidden, "CreatorQuota", "holds 1 runs"},
		{"init of a live run", g.sign("r", 18, initFor("r", carol), carol, nil), http.StatusConflict, "AlreadyInitialized", "already initialized"},
		{"init for a later incarnation", g.signFor(serverwire.Binding{Server: s.ID(), Incarnation: 2}, "c", 19, initFor("c", carol), carol, nil), http.StatusConflict, "Stale", "the next is 1"},
		{"rejected by the coordinator", g.sign("r", 20, &coordinator.SetPaused{Paused: true}, mallory, nil), http.StatusConflict, "Unauthorized", "authority"},
		{"a run that does not exist", g.sign("nope", 21, &coordinator.Tick{}, mallory, nil), http.StatusNotFound, "RunNotFound", `"nope"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := fingerprint(t, s)
			code, body := post(t, hs.URL, tt.req)
			var f serverwire.Failure
			if err := json.Unmarshal([]byte(body), &f); err != nil || code != tt.status || f.Name != tt.want || f.Error == "" {
				t.Fatalf("got %d %s, want %d %s with a message", code, body, tt.status, tt.want)
			}
			if !strings.Contains(f.Error, tt.says) {
				t.Fatalf("the message %q does not say %q", f.Error, tt.says)
			}
			if after := fingerprint(t, s); after != before {
				t.Fatalf("a refused request changed what the server stores:\n%s\nbecame\n%s", before, after)
			}
		})
	}
	// Refusals outside POST /v1/instructions: a body over the limit, and
	// the binding of a run id the server refuses (what a client asks
	// first, so `psyche init-coordinator --run-id .x` gets the reason).
	before := fingerprint(t, s)
	if code, body := post(t, hs.URL, make([]byte, maxBody+1)); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "BadRequest") {
		t.Fatalf("an oversized body: %d %s", code, body)
	}
	resp, err := http.Get(hs.URL + "/v1/runs/.hidden/binding")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `starts with \".\"`) {
		t.Fatalf("binding of .hidden: %d %s", resp.StatusCode, body)
	}
	if _, err := serverclient.New(hs.URL, nil).Send(context.Background(), ".hidden", admin, nil, initFor(".hidden", admin)); !errors.Is(err, serverwire.ErrInvalidRunID) {
		t.Fatalf("a client creating .hidden: %v", err)
	}
	if after := fingerprint(t, s); after != before {
		t.Fatalf("refusals changed what the server stores:\n%s\nbecame\n%s", before, after)
	}
	// The control: an accepted init changes what is stored.
	before = fingerprint(t, s)
	if code, body := post(t, hs.URL, g.sign("c", 30, initFor("c", carol), carol, nil)); code != http.StatusOK {
		t.Fatalf("carol's init: %d %s", code, body)
	}
	if fingerprint(t, s) == before {
		t.Fatal("the fingerprint does not see an accepted init")
	}
}

// TestAnonymousKeysStoreNothing: keys the run does not know can tick and
// be refused as often as they like without growing the replay table or the
// run file; a key whose join is accepted becomes known, and its join cannot
// be replayed.
func TestAnonymousKeysStoreNothing(t *testing.T) {
	s, _, hs := newTestServer(t, t.TempDir())
	c := serverclient.New(hs.URL, nil)
	ctx := context.Background()
	admin := backendtest.Key("admin")
	backendtest.CreateTinyRun(ctx, t, c, "anon", admin)
	before := fingerprint(t, s)
	for i := range 300 {
		key := backendtest.Key(fmt.Sprintf("anon%d", i))
		// A tick anyone may send; with nothing due it is refused
		// (NothingDue), and either way it stores nothing.
		if _, err := c.Send(ctx, "anon", key, nil, &coordinator.Tick{}); err != nil && !errors.Is(err, coordinator.ErrNothingDue) {
			t.Fatal(err)
		}
		if _, err := c.Send(ctx, "anon", key, nil, &coordinator.SetPaused{Paused: true}); !errors.Is(err, coordinator.ErrUnauthorized) {
			t.Fatalf("an anonymous pause: %v", err)
		}
	}
	if after := fingerprint(t, s); after != before {
		t.Fatalf("anonymous keys changed what the server stores:\n%s\nbecame\n%s", before, after)
	}
	alice := backendtest.Key("alice")
	g := newSigner(t, s)
	join := g.sign("anon", 1, &coordinator.JoinRun{ID: coordinator.ClientID{Signer: alice.Public(), P2P: coordinator.Pubkey{1}}}, alice, nil)
	if code, body := post(t, hs.URL, join); code != http.StatusOK {
		t.Fatalf("join: %d %s", code, body)
	}
	if code, body := post(t, hs.URL, join); code != http.StatusConflict || !strings.Contains(body, "Replay") {
		t.Fatalf("the join replayed: %d %s", code, body)
	}
	r := s.run("anon")
	r.mu.Lock()
	n := len(r.replay.seqs)
	r.mu.Unlock()
	if n != 2 { // the admin and alice
		t.Fatalf("%d replay entries, want 2", n)
	}
}

// TestReplayTableForgets: a signer the run no longer knows leaves the
// table, and the floor keeps its old requests refused.
func TestReplayTableForgets(t *testing.T) {
	admin, alice, bob := coordinator.Pubkey{1}, coordinator.Pubkey{2}, coordinator.Pubkey{3}
	st := &coordinator.Coordinator{MainAuthority: admin}
	st.Pending[0] = coordinator.ClientID{Signer: alice}
	st.PendingLen = 1
	var tab replayTable
	tab = tab.record(st, admin, 10)
	tab = tab.record(st, alice, 20)
	tab = tab.record(st, bob, 30) // bob is unknown: nothing stored
	if len(tab.seqs) != 2 || tab.last(alice) != 20 || tab.last(bob) != 0 {
		t.Fatalf("table %+v", tab)
	}
	st.PendingLen = 0 // alice leaves
	tab = tab.record(st, admin, 11)
	for _, tt := range []struct {
		who  coordinator.Pubkey
		want uint64
	}{{admin, 20}, {alice, 20}, {bob, 20}} {
		if got := tab.last(tt.who); got != tt.want {
			t.Errorf("last(%v) = %d, want %d (table %+v)", tt.who[0], got, tt.want, tab)
		}
	}
	if len(tab.seqs) != 1 {
		t.Fatalf("table %+v, want the admin only", tab)
	}
}

// TestReplayAfterFree: requests captured during a run's first life (its
// init, update and resume) are refused after it is freed, after it is
// created again under the same id, and after a restart; a client holding
// the old binding signs again for the new life by itself.
func TestReplayAfterFree(t *testing.T) {
	dir := t.TempDir()
	s, _, hs := newTestServer(t, dir)
	g := newSigner(t, s)
	admin := backendtest.Key("admin")
	rid, _ := coordinator.ParseRunID("phoenix")
	k, m := backendtest.TinyConfig(), backendtest.TinyModel()
	captured := [][]byte{
		g.sign("phoenix", 1, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}, admin, nil),
		g.sign("phoenix", 2, &coordinator.Update{Config: &k, Model: &m}, admin, nil),
		g.sign("phoenix", 3, &coordinator.SetPaused{}, admin, nil),
	}
	for _, req := range captured {
		if code, body := post(t, hs.URL, req); code != http.StatusOK {
			t.Fatalf("first life: %d %s", code, body)
		}
	}
	c := serverclient.New(hs.URL, nil) // fetches the first life's binding
	if _, err := c.Send(context.Background(), "phoenix", admin, nil, &coordinator.SetPaused{Paused: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(context.Background(), "phoenix", admin, nil, &coordinator.FreeCoordinator{}); err != nil {
		t.Fatalf("free: %v", err)
	}
	refusedAll := func(when string, url string) {
		t.Helper()
		for i, req := range captured {
			code, body := post(t, url, req)
			refused := false
			for _, why := range []string{"Stale", "RunNotFound", "AlreadyInitialized"} {
				refused = refused || strings.Contains(body, why)
			}
			if code == http.StatusOK || !refused {
				t.Fatalf("%s: captured request %d: %d %s", when, i, code, body)
			}
		}
	}
	refusedAll("after the free", hs.URL)
	if b, _, _ := s.Binding("phoenix"); b.Incarnation != 2 {
		t.Fatalf("the next init is for incarnation %d, want 2", b.Incarnation)
	}
	// The admin creates the run again: its client still holds the first
	// life's binding, is refused as stale, and signs again.
	if _, err := c.Send(context.Background(), "phoenix", admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}); err != nil {
		t.Fatalf("second init: %v", err)
	}
	refusedAll("after the second init", hs.URL)
	if _, err := c.Send(context.Background(), "phoenix", admin, nil, &coordinator.Update{Config: &k, Model: &m}); err != nil {
		t.Fatalf("update in the second life: %v", err)
	}
	// A restart keeps the incarnation, and a freed run's tombstone.
	hs.Close()
	s2, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	hs2 := httptest.NewServer(s2.Handler())
	defer hs2.Close()
	if s2.ID() != s.ID() {
		t.Fatal("the server's identity changed across a restart")
	}
	refusedAll("after a restart", hs2.URL)
	c2 := serverclient.New(hs2.URL, nil)
	for _, ix := range []coordinator.Instruction{&coordinator.FreeCoordinator{}} {
		if _, err := c2.Send(context.Background(), "phoenix", admin, nil, ix); err != nil {
			t.Fatal(err)
		}
	}
	s3, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, _, _ := s3.Binding("phoenix"); b.Incarnation != 3 {
		t.Fatalf("after two lives and a restart the next init is for incarnation %d, want 3", b.Incarnation)
	}
}

// TestCorruptRunIsQuarantined: a run whose file has a flipped bit, or is
// not a run file at all, is quarantined with a clear error (it cannot be
// read, created again or written) while every other run is served; a file
// of the first format is still read.
func TestCorruptRunIsQuarantined(t *testing.T) {
	dir := t.TempDir()
	_, _, hs := newTestServer(t, dir)
	c := serverclient.New(hs.URL, nil)
	ctx := context.Background()
	admin := backendtest.Key("admin")
	for _, id := range []string{"good", "flipped", "garbage", "old"} {
		rid, _ := coordinator.ParseRunID(id)
		if _, err := c.Send(ctx, id, admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}); err != nil {
			t.Fatal(err)
		}
	}
	hs.Close()
	// A bit of main_authority flips: without the checksum, the real admin
	// would be locked out.
	path := runPath(dir, "flipped")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := decodeRun(b)
	if err != nil {
		t.Fatal(err)
	}
	acct := st.state.MarshalAccount()
	pub := admin.Public()
	mainAt := bytes.Index(acct, pub[:])
	if mainAt < 0 {
		t.Fatal("the main authority is not in the account")
	}
	b[storeHeader+mainAt] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(runPath(dir, "garbage"), []byte("PSRS\x02not a run"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The first format: no checksum, no incarnation.
	old, _ := readRun(runPath(dir, "old"))
	v1 := append([]byte(storeMagic), storeVersionV1, 0, 0, 0)
	v1 = append(v1, old.state.MarshalAccount()...)
	v1 = binary.LittleEndian.AppendUint32(v1, 0)
	if err := os.WriteFile(runPath(dir, "old"), v1, 0o644); err != nil {
		t.Fatal(err)
	}
	flippedBefore, _ := os.ReadFile(path)

	s2, err := New(dir)
	if err != nil {
		t.Fatalf("one bad file stopped the server: %v", err)
	}
	hs2 := httptest.NewServer(s2.Handler())
	defer hs2.Close()
	q := s2.Quarantined()
	if len(q) != 2 || !strings.Contains(q["flipped"], "checksum mismatch") || !strings.Contains(q["garbage"], "corrupt") {
		t.Fatalf("quarantined: %v", q)
	}
	if got := s2.Runs(); strings.Join(got, ",") != "good,old" {
		t.Fatalf("served runs %v, want good and old", got)
	}
	c2 := serverclient.New(hs2.URL, nil)
	var md coordinator.Metadata
	copy(md.Name[:], "still served")
	for _, id := range []string{"good", "old"} {
		if _, err := c2.Send(ctx, id, admin, nil, &coordinator.Update{Metadata: &md}); err != nil {
			t.Fatalf("run %s beside the quarantined ones: %v", id, err)
		}
		if _, err := c2.Snapshot(ctx, id); err != nil {
			t.Fatalf("run %s: %v", id, err)
		}
	}
	rid, _ := coordinator.ParseRunID("flipped")
	for _, ix := range []coordinator.Instruction{&coordinator.Update{Metadata: &md}, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}} {
		if _, err := c2.Send(ctx, "flipped", admin, nil, ix); !errors.Is(err, serverwire.ErrQuarantined) || !strings.Contains(err.Error(), "checksum mismatch") {
			t.Fatalf("%s on a quarantined run: %v", ix.Name(), err)
		}
	}
	resp, err := http.Get(hs2.URL + "/v1/runs/flipped")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "quarantined") {
		t.Fatalf("GET a quarantined run: %d %s", resp.StatusCode, body)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, flippedBefore) {
		t.Fatal("the quarantined file was changed")
	}
}

// TestKillDuringWritesLeavesEveryRunReadable kills the server with SIGKILL
// while clients keep changing several runs, then checks that a new server
// on the same directory reads every run (none quarantined, no temporary
// file taken for a run) with at least the state last acknowledged.
func TestKillDuringWritesLeavesEveryRunReadable(t *testing.T) {
	dir := t.TempDir()
	url, kill := startChild(t, dir)
	c := serverclient.New(url, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := backendtest.Key("admin")
	ids := []string{"k0", "k1", "k2", "k3"}
	for _, id := range ids {
		rid, _ := coordinator.ParseRunID(id)
		if _, err := c.Send(ctx, id, admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	acked := map[string]uint64{}
	acks := make(chan struct{}, 1024)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := serverclient.New(url, nil) // one sequence per writer
			for i := 0; ctx.Err() == nil; i++ {
				var md coordinator.Metadata
				copy(md.Name[:], fmt.Sprintf("%s-%d", id, i))
				r, err := cl.Send(ctx, id, admin, nil, &coordinator.Update{Metadata: &md})
				if err != nil {
					return // the server is gone
				}
				mu.Lock()
				acked[id] = max(acked[id], r.Nonce)
				mu.Unlock()
				select {
				case acks <- struct{}{}:
				default:
				}
			}
		}()
	}
	// Kill once every writer has been acknowledged a few times: the kill
	// lands while writes are in flight.
	for range 40 {
		<-acks
	}
	kill()
	cancel()
	wg.Wait()
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if q := s.Quarantined(); len(q) != 0 {
		t.Fatalf("after a kill -9: quarantined %v", q)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		acct, ok := s.Account(id)
		if !ok {
			t.Fatalf("run %s is gone after a kill -9", id)
		}
		st, err := coordinator.DecodeAccount(acct)
		if err != nil {
			t.Fatal(err)
		}
		if st.Nonce < acked[id] {
			t.Fatalf("run %s: nonce %d after the kill, %d acknowledged", id, st.Nonce, acked[id])
		}
	}
}

// openStream starts an event stream from local address from (nil: any)
// and returns the response (its body unread) or the refusal.
func openStream(t *testing.T, url, id string, from net.Addr) (*http.Response, error) {
	t.Helper()
	d := &net.Dialer{LocalAddr: from}
	cl := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	return cl.Get(url + "/v1/runs/" + id + "/events")
}

func waitGauge(t *testing.T, what string, get func() float64, want float64) {
	t.Helper()
	// The server notices a closed stream when its handler returns: wait
	// for that event, however long a loaded machine takes.
	for get() != want {
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSubscriberLimits: streams are capped per remote address and in all,
// refused with 429 and a message, and a closed stream gives its place back.
func TestSubscriberLimits(t *testing.T) {
	m := NewMetrics(nil)
	s, hs := serveHTTP(t, WithSubscriberLimits(3, 2), WithMetrics(m))
	admin := backendtest.Key("admin")
	rid, _ := coordinator.ParseRunID("sse")
	if _, err := serverclient.New(hs.URL, nil).Send(context.Background(), "sse", admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}); err != nil {
		t.Fatal(err)
	}
	one, two := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}
	var open []*http.Response
	defer func() {
		for _, r := range open {
			r.Body.Close()
		}
	}()
	for i, tt := range []struct {
		from   net.Addr
		status int
	}{
		{one, http.StatusOK}, {one, http.StatusOK},
		{one, http.StatusTooManyRequests}, // the address's limit
		{two, http.StatusOK},
		{two, http.StatusTooManyRequests}, // the server's limit
	} {
		resp, err := openStream(t, hs.URL, "sse", tt.from)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if resp.StatusCode != tt.status {
			t.Fatalf("stream %d from %v: HTTP %d, want %d", i, tt.from, resp.StatusCode, tt.status)
		}
		if resp.StatusCode == http.StatusOK {
			open = append(open, resp)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "TooManySubscribers") {
			t.Fatalf("stream %d refused with %s", i, body)
		}
	}
	// The server's own page follows every run in process whatever
	// strangers hold: the caps are full, and it subscribes to more runs
	// than one address may (B14: with 1,018 anonymous streams or 100+ runs
	// its runs showed "unknown").
	ctx, cancel := context.WithCancel(context.Background())
	for i := range 4 {
		id := fmt.Sprintf("page%d", i)
		pid, _ := coordinator.ParseRunID(id)
		if _, err := serverclient.New(hs.URL, nil).Send(ctx, id, admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: pid}); err != nil {
			t.Fatal(err)
		}
		snaps, err := s.Subscribe(ctx, id)
		if err != nil {
			t.Fatalf("the page's subscription to run %d while strangers hold every stream: %v", i, err)
		}
		if snap := <-snaps; snap.State == nil {
			t.Fatalf("run %d: no state", i)
		}
	}
	if resp, err := openStream(t, hs.URL, "sse", two); err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a stranger's stream once the page subscribed: %v %v, want still 429", resp, err)
	} else {
		resp.Body.Close()
	}
	cancel()
	open[0].Body.Close()
	open = open[1:]
	waitGauge(t, "subscribers", func() float64 { return promread.Value(m.Subscribers) }, 2)
	resp, err := openStream(t, hs.URL, "sse", one)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after a stream closed: %v %v", resp, err)
	}
	open = append(open, resp)
}

// TestSlowSubscriberIsDropped: a client that opens a stream and never reads
// is cut off once an event cannot be written within the timeout, and the
// server goes on serving.
func TestSlowSubscriberIsDropped(t *testing.T) {
	m := NewMetrics(nil)
	_, hs := serveHTTP(t, WithSlowSubscriber(50*time.Millisecond), WithMetrics(m))
	admin := backendtest.Key("admin")
	c := serverclient.New(hs.URL, nil)
	ctx := context.Background()
	rid, _ := coordinator.ParseRunID("slow")
	if _, err := c.Send(ctx, "slow", admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}); err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(hs.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/runs/slow/events HTTP/1.1\r\nHost: x\r\n\r\n")
	waitGauge(t, "subscribers", func() float64 { return promread.Value(m.Subscribers) }, 1)
	// Every change is an event of ~217 KB that nobody reads: the socket
	// buffers fill, a write blocks past the timeout, the stream is dropped.
	for i := 0; promread.Value(m.SlowSubscribers) == 0; i++ {
		if i == 2000 {
			t.Fatal("a stream nobody reads was never dropped")
		}
		var md coordinator.Metadata
		copy(md.Name[:], fmt.Sprint(i))
		if _, err := c.Send(ctx, "slow", admin, nil, &coordinator.Update{Metadata: &md}); err != nil {
			t.Fatal(err)
		}
	}
	waitGauge(t, "subscribers", func() float64 { return promread.Value(m.Subscribers) }, 0)
	var md coordinator.Metadata
	copy(md.Name[:], "after")
	if _, err := c.Send(ctx, "slow", admin, nil, &coordinator.Update{Metadata: &md}); err != nil {
		t.Fatalf("the server after dropping a stream: %v", err)
	}
}

// TestStreamsOutliveHTTPTimeouts: the server's read and write timeouts
// bound requests, not event streams, which end only when their client stops
// reading.
func TestStreamsOutliveHTTPTimeouts(t *testing.T) {
	// Short timeouts, but not so short that a loaded machine could not
	// read one request's headers within them (they bound that too).
	s, err := New(t.TempDir(), WithHTTPTimeouts(250*time.Millisecond, 250*time.Millisecond, 5*time.Second), WithManualTicks())
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + serveLocal(t, s)
	admin := backendtest.Key("admin")
	// Instructions go to Execute directly: over HTTP, the tight write
	// timeout would bound how long persisting them may take.
	g := newSigner(t, s)
	rid, _ := coordinator.ParseRunID("long")
	if _, f, _ := s.Execute(g.sign("long", 1, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}, admin, nil)); f != nil {
		t.Fatal(f.Error)
	}
	resp, err := openStream(t, url, "long", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	events := bufio.NewReader(resp.Body)
	next := func() *coordinator.Coordinator {
		t.Helper()
		for {
			line, err := events.ReadString('\n')
			if err != nil {
				t.Fatalf("the stream ended: %v", err)
			}
			if data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
				b, err := base64.StdEncoding.DecodeString(data)
				if err != nil {
					t.Fatal(err)
				}
				st, err := coordinator.DecodeAccount(b)
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
		}
	}
	first := next()
	// Longer than both timeouts: a stream bound by them would be cut.
	time.Sleep(time.Second)
	var md coordinator.Metadata
	copy(md.Name[:], "later")
	if _, f, _ := s.Execute(g.sign("long", 2, &coordinator.Update{Metadata: &md}, admin, nil)); f != nil {
		t.Fatal(f.Error)
	}
	if st := next(); st.Nonce <= first.Nonce {
		t.Fatalf("nonce %d after %d", st.Nonce, first.Nonce)
	}
}

// FuzzDecodeRun: a state file is outside bytes (a disk, a backup, an
// operator's editor). Whatever decodeRun accepts must encode to a file
// that decodes to the same thing.
func FuzzDecodeRun(f *testing.F) {
	admin := backendtest.Key("admin")
	st, err := coordinator.New(coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: [coordinator.MaxRunIDLen]byte{'f'}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(encodeRun(&stored{incarnation: 3, state: st, replay: replayTable{seqs: map[coordinator.Pubkey]uint64{admin.Public(): 9}, floor: 4}}))
	f.Add(encodeRun(&stored{incarnation: 2, freed: true}))
	f.Add([]byte("PSRS\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRunFile(t, data)
		// Most mutations only break the checksum: also read the same
		// bytes with a checksum that fits, so the fuzzer reaches the
		// checks behind it.
		if len(data) >= storeHeader+sha256.Size {
			fixed := bytes.Clone(data)
			sum := sha256.Sum256(fixed[:len(fixed)-sha256.Size])
			copy(fixed[len(fixed)-sha256.Size:], sum[:])
			checkRunFile(t, fixed)
		}
	})
}

// checkRunFile decodes a state file and, if it is accepted, checks that it encodes
// to one that decodes to the same run.
func checkRunFile(t *testing.T, data []byte) {
	t.Helper()
	st, err := decodeRun(data)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("an error that is not ErrCorrupt: %v", err)
		}
		return
	}
	again, err := decodeRun(encodeRun(st))
	if err != nil {
		t.Fatalf("re-encoded file: %v", err)
	}
	if again.incarnation != st.incarnation || again.freed != st.freed || again.replay.floor != st.replay.floor ||
		len(again.replay.seqs) != len(st.replay.seqs) {
		t.Fatalf("round trip: %+v became %+v", st, again)
	}
	if !st.freed && !bytes.Equal(again.state.MarshalAccount(), st.state.MarshalAccount()) {
		t.Fatal("round trip changed the account")
	}
}
