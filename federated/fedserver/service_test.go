package fedserver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/fedclient"
	"github.com/psyche-go/psyche/federated/secagg"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// newSigner is the key pair a name stands for, the same in every run of the
// tests (chain.Keypair already signs as federated.Signer asks).
func newSigner(name string) *chain.Keypair {
	return chain.KeypairFromSeed(sha256.Sum256([]byte(name)))
}

// accounts is a fake server holding one run's coordinator.
type accounts struct {
	mu sync.Mutex
	c  *coordinator.Coordinator
}

func newAccounts(t testing.TB, authority coordinator.Pubkey) *accounts {
	c := new(coordinator.Coordinator)
	c.MainAuthority = authority
	if err := coordinator.SetFixedString(c.RunID[:], "fed"); err != nil {
		t.Fatal(err)
	}
	modelspec.SetGPT(&c.Model, gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2})
	if err := coordinator.SetFixedString(c.Model.Checkpoint.Source.URL[:], "seed:1"); err != nil {
		t.Fatal(err)
	}
	c.RunState = coordinator.WaitingForMembers
	return &accounts{c: c}
}

func (a *accounts) get(id string) ([]byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if id != "fed" || a.c == nil {
		return nil, false
	}
	return a.c.MarshalAccount(), true
}

func (a *accounts) setState(s coordinator.RunState) {
	a.mu.Lock()
	a.c.RunState = s
	a.mu.Unlock()
}

func serve(t *testing.T, dir string, acc *accounts) (*Service, string) {
	svc, err := New(dir, acc.get, WithNoiseSeeds(func() [32]byte { return [32]byte{7} }))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	svc.Routes(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return svc, hs.URL
}

// configuredRun serves, in dir, the run "fed" once its authority (the signer
// "admin") has configured it with cfg: the start most tests of a live run
// share.
func configuredRun(t *testing.T, dir string, cfg *federated.Config) (*accounts, string, *federated.Info) {
	t.Helper()
	admin := newSigner("admin")
	acc := newAccounts(t, admin.Public())
	_, url := serve(t, dir, acc)
	info, err := fedclient.New(url, "fed", admin).Configure(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return acc, url, info
}

// join is a client of the run at url named name, once it has joined (only
// members push).
func join(t testing.TB, url, name string) *fedclient.Client {
	t.Helper()
	c := fedclient.New(url, "fed", newSigner(name))
	if _, err := c.Join(context.Background(), nil); err != nil {
		t.Fatalf("%s joining: %v", name, err)
	}
	return c
}

func ones(n int, v float32) []float32 {
	d := make([]float32, n)
	for i := range d {
		d[i] = v
	}
	return d
}

// TestFederatedService walks a run through the HTTP API: the authority's
// config starts it from the coordinator's model; updates fill the buffer,
// which aggregates at capacity; a stale update is refused with the
// server's round and the client catches up; a paused run refuses updates;
// a restart mid-round keeps the round, the model and the buffered update.
func TestFederatedService(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	admin := newSigner("admin")
	acc := newAccounts(t, admin.Public())
	_, url := serve(t, dir, acc)

	a, b, c := fedclient.New(url, "fed", newSigner("a")), fedclient.New(url, "fed", newSigner("b")), fedclient.New(url, "fed", newSigner("c"))
	cfg := &federated.Config{Capacity: 2, RoundDuration: 1}
	if _, err := a.Configure(ctx, cfg); err == nil {
		t.Fatal("a client that is not the authority configured the run")
	}
	if _, _, err := a.Push(ctx, 0, 1, []float32{1}); err == nil {
		t.Fatal("an update was taken before the run was federated")
	}
	info, err := fedclient.New(url, "fed", admin).Configure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := info.Params
	if _, _, err := a.Push(ctx, 0, 1, ones(n, 1)); !errors.Is(err, federated.ErrNotMember) {
		t.Fatalf("an update from a key that never joined: %v, want %v", err, federated.ErrNotMember)
	}
	a, b, c = join(t, url, "a"), join(t, url, "b"), join(t, url, "c")
	if n != (gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}).NumParams() {
		t.Fatalf("the run's model has %d values", n)
	}
	round, model0, err := a.Model(ctx, -1)
	if err != nil || round != 0 {
		t.Fatal(round, err)
	}
	if _, _, err := a.Push(ctx, 0, 1, ones(n-1, 1)); err == nil {
		t.Fatal("an update of the wrong shape was taken")
	}
	// A waiter for round 1 wakes up when the buffer aggregates.
	woke := make(chan uint64, 1)
	go func() {
		r, _, err := c.Model(ctx, 0)
		if err != nil {
			t.Error(err)
		}
		woke <- r
	}()
	if res, _, err := a.Push(ctx, 0, 1, ones(n, 1)); err != nil || res.Round != 0 || res.Buffered != 1 {
		t.Fatal(res, err)
	}
	if res, _, err := b.Push(ctx, 0, 1, ones(n, 3)); err != nil || res.Round != 1 || res.Buffered != 0 {
		t.Fatal(res, err)
	}
	if r := <-woke; r != 1 {
		t.Fatalf("the waiter woke at round %d", r)
	}
	_, model1, _ := c.Model(ctx, -1)
	for i := range model1 {
		if model1[i] != model0[i]+2 {
			t.Fatalf("value %d: %v, want %v+2 (the mean of the updates)", i, model1[i], model0[i])
		}
	}
	// c trained on round 0: refused as stale, with the server's round.
	_, _, err = c.Push(ctx, 0, 1, ones(n, 5))
	var stale *fedclient.StaleError
	if !errors.As(err, &stale) || stale.Round != 1 || !errors.Is(err, federated.ErrStale) {
		t.Fatalf("stale update: %v", err)
	}
	if res, _, err := c.Push(ctx, 1, 1, ones(n, 1)); err != nil || res.Buffered != 1 {
		t.Fatal(res, err)
	}
	// Paused: refused.
	acc.setState(coordinator.Paused)
	if _, _, err := a.Push(ctx, 1, 1, ones(n, 1)); !errors.Is(err, fedclient.ErrPaused) {
		t.Fatalf("update to a paused run: %v", err)
	}
	acc.setState(coordinator.WaitingForMembers)

	// Restart mid-round: a second service on the same directory.
	_, url2 := serve(t, dir, acc)
	a2 := fedclient.New(url2, "fed", newSigner("a"))
	in, err := a2.Info(ctx)
	if err != nil || in.Round != 1 || in.Buffered != 1 || in.Contributions != 2 {
		t.Fatalf("after a restart: %+v %v", in, err)
	}
	_, again, _ := a2.Model(ctx, -1)
	if !slices.Equal(again, model1) {
		t.Fatal("the model changed across the restart")
	}
	if res, _, err := a2.Push(ctx, 1, 1, ones(n, 3)); err != nil || res.Round != 2 {
		t.Fatal(res, err)
	}
	_, model2, _ := a2.Model(ctx, -1)
	for i := range model2 {
		if model2[i] != model1[i]+2 {
			t.Fatalf("value %d after the restart: %v, want %v+2 (c's buffered update survived)", i, model2[i], model1[i])
		}
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, "*.fed")); len(matches) != 1 {
		t.Fatalf("state files: %v", matches)
	}
}

// TestSecureAggregationWithADropout: four clients, threshold 3; client 4
// vanishes after sending its shares. The mask phase closes at its deadline
// with three inputs, the survivors reveal, and the model moves by the mean
// of the three updates, within fixed-point error.
func TestSecureAggregationWithADropout(t *testing.T) {
	ctx := context.Background()
	_, url, info := configuredRun(t, t.TempDir(), &federated.Config{Capacity: 4, RoundDuration: 1, Clip: 1, SecAgg: true, SecAggThreshold: 3, SecAggTimeout: 1})
	n := info.Params
	probe := fedclient.New(url, "fed", newSigner("probe"))
	_, model0, err := probe.Model(ctx, -1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := probe.Push(ctx, 0, 1, ones(n, 0)); err == nil {
		t.Fatal("a plain update was taken by a secure aggregation run")
	}
	deltas := make([][]float32, 4)
	for i := range deltas {
		deltas[i] = make([]float32, n)
		for j := range deltas[i] {
			deltas[i][j] = float32((i+1)*(j%7)-9) / float32(40*n) // L2 norm well below 1
		}
	}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := join(t, url, string(rune('a'+i)))
			var hooks fedclient.SecAggHooks
			if i == 3 {
				hooks.AfterShares = func() error { return errors.New("gone") }
			}
			_, errs[i] = c.SecAggRound(ctx, 0, deltas[i], 1, 3, 0, hooks)
		}()
	}
	wg.Wait()
	for i, err := range errs[:3] {
		if err != nil {
			t.Fatalf("client %d: %v", i+1, err)
		}
	}
	round, model1, err := probe.Model(ctx, 0)
	if err != nil || round != 1 {
		t.Fatalf("round %d %v", round, err)
	}
	f, _ := secaggFractionBits(4, 1)
	tol := 3*math.Ldexp(1, -f-1)/3 + 1e-6
	for j := range model1 {
		want := float64(model0[j]) + (float64(deltas[0][j])+float64(deltas[1][j])+float64(deltas[2][j]))/3
		if math.Abs(float64(model1[j])-want) > tol+math.Abs(want)*1e-6 {
			t.Fatalf("value %d: %v, want %v", j, model1[j], want)
		}
	}
	in, _ := probe.Info(ctx)
	if in.Contributions != 3 {
		t.Fatalf("%d contributions, want 3", in.Contributions)
	}
}

var secaggFractionBits = secagg.FractionBits

// TestDistroCompressedUpdates: a run whose optimizer is DisTrO takes
// frames, not dense updates; a frame moves the model by the run's learning
// rate times the sign of its decompressed direction, on the coordinates
// its top-k coefficients reach.
func TestDistroCompressedUpdates(t *testing.T) {
	ctx := context.Background()
	admin := newSigner("admin")
	acc := newAccounts(t, admin.Public())
	m := &acc.c.Model
	m.Optimizer.Kind = coordinator.OptimizerDistro
	m.Optimizer.CompressionChunk, m.Optimizer.CompressionTopK, m.Optimizer.Quantize1Bit = 16, 4, true
	m.Optimizer.Aggregation = coordinator.AggregationMean
	m.LR.BaseLR = 0.01
	_, url := serve(t, t.TempDir(), acc)
	if _, err := fedclient.New(url, "fed", admin).Configure(ctx, &federated.Config{Capacity: 1, RoundDuration: 1, Clip: 1, SecAgg: true, SecAggThreshold: 1}); err == nil {
		t.Fatal("secure aggregation was configured on a DisTrO run")
	}
	info, err := fedclient.New(url, "fed", admin).Configure(ctx, &federated.Config{Capacity: 1, RoundDuration: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := join(t, url, "a")
	if _, _, err := c.Push(ctx, 0, 1, ones(info.Params, 1)); !errors.Is(err, federated.ErrEncoding) && err == nil {
		t.Fatal("a dense update was taken by a DisTrO run")
	}
	demo, sizes, err := federated.Distro(m)
	if err != nil {
		t.Fatal(err)
	}
	var g [][]float32
	for i, n := range sizes {
		part := make([]float32, n)
		for j := range part {
			part[j] = -float32((i+j)%5 - 2) // the update is the negation
		}
		g = append(g, part)
	}
	f, err := demo.Step(g, 1)
	if err != nil {
		t.Fatal(err)
	}
	frame, err := f.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	_, before, _ := c.Model(ctx, -1)
	res, sent, err := c.PushFrame(ctx, 0, 1, frame)
	if err != nil || res.Round != 1 {
		t.Fatal(res, err)
	}
	if sent >= info.Params {
		t.Fatalf("a frame of %d bytes for %d parameters is no compression", sent, info.Params)
	}
	_, after, _ := c.Model(ctx, -1)
	moved := 0
	for i := range after {
		d := float64(after[i] - before[i])
		if d != 0 {
			moved++
			if math.Abs(math.Abs(d)-0.01) > 1e-6 {
				t.Fatalf("value %d moved by %v, want ±0.01 (the run's learning rate)", i, d)
			}
		}
	}
	if moved == 0 {
		t.Fatal("the frame did not move the model")
	}
	bad := append([]byte(nil), frame...)
	bad[len(bad)/2] ^= 0xff
	if _, _, err := c.PushFrame(ctx, 1, 1, bad[:len(bad)-3]); err == nil {
		t.Fatal("a truncated frame was taken")
	}
	t.Logf("a frame of %d bytes (request) for %d parameters moved %d of them", sent, info.Params, moved)
}

// TestFreedRunIsForgotten: the state of a run that was freed is not served
// to the run created again under its id by someone else, and nobody's read
// removes it (B5: an anonymous GET deleted the file of a run the server had
// only quarantined); the new run's first config replaces it, and Forget
// (the server's WithOnFree) removes it when the run is freed.
func TestFreedRunIsForgotten(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	acc := newAccounts(t, newSigner("admin").Public())
	svc, url := serve(t, dir, acc)
	cfg := &federated.Config{Capacity: 1, RoundDuration: 1}
	info, err := fedclient.New(url, "fed", newSigner("admin")).Configure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := join(t, url, "a")
	if res, _, err := a.Push(ctx, 0, 1, ones(info.Params, 1)); err != nil || res.Round != 1 {
		t.Fatal(res, err)
	}
	file := filepath.Join(dir, "fed"+fileExt)
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	acc.mu.Lock()
	acc.c.MainAuthority = newSigner("someone else").Public()
	acc.mu.Unlock()
	if _, err := a.Info(ctx); err == nil {
		t.Fatal("the old run's state was served for the new run")
	}
	if _, _, err := a.Model(ctx, -1); err == nil {
		t.Fatal("the old run's model was served for the new run")
	}
	acc.mu.Lock()
	acc.c = nil // the server does not serve the run (freed, or quarantined there)
	acc.mu.Unlock()
	if _, err := a.Info(ctx); err == nil {
		t.Fatal("state served for a run the server does not serve")
	}
	if after, err := os.ReadFile(file); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("a reader changed or removed the state file: %v", err)
	}
	acc.mu.Lock()
	acc.c = newAccounts(t, newSigner("someone else").Public()).c
	acc.mu.Unlock()
	in, err := fedclient.New(url, "fed", newSigner("someone else")).Configure(ctx, cfg)
	if err != nil || in.Round != 0 || in.Contributions != 0 {
		t.Fatalf("the new run: %+v %v", in, err)
	}
	if after, _ := os.ReadFile(file); bytes.Equal(after, before) {
		t.Fatal("the new run's config did not replace the old state file")
	}
	svc.Forget("fed")
	if files, _ := filepath.Glob(filepath.Join(dir, "*"+fileExt)); len(files) != 0 {
		t.Fatalf("state files left after Forget: %v", files)
	}
}

// TestCorruptStateIsQuarantined: one flipped byte in a run's state file
// quarantines that run alone (B4: the whole server refused to start): the
// service starts, the run is refused with 503 naming the file, and the file
// is left as it is; its authority's config does not overwrite it.
func TestCorruptStateIsQuarantined(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	admin := newSigner("admin")
	cfg := &federated.Config{Capacity: 2, RoundDuration: 1}
	acc, _, _ := configuredRun(t, dir, cfg)
	file := filepath.Join(dir, "fed"+fileExt)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Another run's file beside it, empty: quarantined on its own.
	if err := os.WriteFile(filepath.Join(dir, "other"+fileExt), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	svc, url := serve(t, dir, acc)
	if q := svc.Quarantined(); len(q) != 2 || q["fed"] == "" {
		t.Fatalf("quarantined: %v", q)
	}
	c := fedclient.New(url, "fed", admin)
	for what, call := range map[string]func() error{
		"info":   func() error { _, err := c.Info(ctx); return err },
		"model":  func() error { _, _, err := c.Model(ctx, -1); return err },
		"config": func() error { _, err := c.Configure(ctx, cfg); return err },
		"push":   func() error { _, _, err := c.Push(ctx, 0, 1, ones(10, 1)); return err },
	} {
		if err := call(); err == nil || !strings.Contains(err.Error(), "Quarantined: fedserver: run \"fed\" is quarantined") {
			t.Errorf("%s of a quarantined run: %v, want Quarantined", what, err)
		}
	}
	if after, err := os.ReadFile(file); err != nil || !bytes.Equal(after, b) {
		t.Fatalf("the quarantined file changed: %v", err)
	}
}

// TestSecAggRoundAbortedByRestart: a server restart drops the secure
// aggregation round under way (its state is in memory only): the clients'
// waits answer Aborted, and the round played again on the restarted server
// completes.
func TestSecAggRoundAbortedByRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	admin := newSigner("admin")
	acc, url, info := configuredRun(t, dir, &federated.Config{Capacity: 3, RoundDuration: 1, Clip: 1, SecAgg: true, SecAggThreshold: 2, SecAggTimeout: 60})
	// They join the first server; the restarted one knows them.
	for _, name := range []string{"a", "b", "c"} {
		join(t, url, name)
	}
	// Client a advertises on the first server and waits for the others.
	stuck := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, err := fedclient.New(url, "fed", newSigner("a")).SecAggRound(cctx, 0, ones(info.Params, 0.001), 1, 2, 0, fedclient.SecAggHooks{})
		stuck <- err
	}()
	// The restart: a second service on the same directory.
	_, url2 := serve(t, dir, acc)
	resp, err := http.Get(url2 + "/v1/runs/fed/federated/secagg?base=0&phase=keys&id=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("a wait on the restarted server: %s, want 409 (Aborted)", resp.Status)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, name := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = fedclient.New(url2, "fed", newSigner(name)).SecAggRound(ctx, 0, ones(info.Params, 0.001), 1, 2, 0, fedclient.SecAggHooks{})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("client %d on the restarted server: %v", i, err)
		}
	}
	in, err := fedclient.New(url2, "fed", admin).Info(ctx)
	if err != nil || in.Round != 1 || in.Contributions != 3 {
		t.Fatalf("after the replayed round: %+v %v", in, err)
	}
	cancel()
	if err := <-stuck; err == nil {
		t.Fatal("the round on the old server completed")
	}
}

// TestRefusalsWriteNothing: updates refused from fresh keys leave the state
// file as it was (B3: each added 40 bytes and rewrote the whole state, 249
// MiB written for 327 KiB sent).
func TestRefusalsWriteNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	_, url, info := configuredRun(t, dir, &federated.Config{Capacity: 2, RoundDuration: 1})
	file := filepath.Join(dir, "fed"+fileExt)
	before, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		c := fedclient.New(url, "fed", newSigner(fmt.Sprint("stranger", i)))
		if _, _, err := c.Push(ctx, 0, 1, ones(info.Params+1, 1)); err == nil {
			t.Fatal("an update of the wrong shape was accepted")
		}
	}
	after, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("refusals rewrote the state: %d bytes at %v, was %d at %v", after.Size(), after.ModTime(), before.Size(), before.ModTime())
	}
}

// TestBodyBoundedByTheRun: a request whose header declares a payload larger
// than the run's model allows is refused from the header alone, before the
// body is read or allocated for (B6: bodies were read whole, up to 64 MiB,
// before the run or the signature was looked at); so is one to a run that
// is not federated. The client here sends the header and nothing more.
func TestBodyBoundedByTheRun(t *testing.T) {
	ctx := context.Background()
	acc := newAccounts(t, newSigner("admin").Public())
	_, url := serve(t, t.TempDir(), acc)
	info, err := fedclient.New(url, "fed", newSigner("admin")).Configure(ctx, &federated.Config{Capacity: 2, RoundDuration: 1})
	if err != nil {
		t.Fatal(err)
	}
	// A real request's header, with its payload length raised.
	req, err := federated.EncodeRequest(federated.KindUpdate, "fed", 1, make([]byte, 8), newSigner("stranger"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		run     string
		payload int
		status  int
	}{
		{"64 MiB to a small run", "fed", 64 << 20, http.StatusRequestEntityTooLarge},
		{"just past the run's bound", "fed", federated.MaxPayloadFor(federated.KindUpdate, info.Params) + 1, http.StatusRequestEntityTooLarge},
		{"a run that does not exist", "nope", 1 << 20, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := slices.Clone(req[:federated.RequestHeaderSize])
			copy(head[8:40], make([]byte, 32))
			copy(head[8:40], tc.run)
			binary.LittleEndian.PutUint32(head[48:], uint32(tc.payload))
			conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // a hang guard: the answer takes milliseconds
			// Connection: close, so that net/http does not drain a small
			// body before it answers (it would wait for bytes never sent).
			fmt.Fprintf(conn, "POST /v1/federated HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", len(head)+tc.payload+96)
			if _, err := conn.Write(head); err != nil {
				t.Fatal(err)
			}
			// Nothing more is sent: the answer must come from the header.
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("HTTP %d, want %d", resp.StatusCode, tc.status)
			}
		})
	}
}

// TestJoinAuthority: only members push (B1: updates from fresh keys were
// accepted, also in a run whose join authority had refused their join_run).
// In a run with a join authority, joining takes the authority's token for
// the key; a secure aggregation round admits members only (B7: three fresh
// keys took every slot of a round).
func TestJoinAuthority(t *testing.T) {
	ctx := context.Background()
	admin, gate := newSigner("admin"), newSigner("gate")
	acc := newAccounts(t, admin.Public())
	acc.c.JoinAuthority = gate.Public()
	_, url := serve(t, t.TempDir(), acc)
	info, err := fedclient.New(url, "fed", admin).Configure(ctx, &federated.Config{Capacity: 3, RoundDuration: 1, Clip: 1,
		SecAgg: true, SecAggThreshold: 2})
	if err != nil {
		t.Fatal(err)
	}
	stranger := fedclient.New(url, "fed", newSigner("stranger"))
	someoneElses, err := federated.JoinToken(gate, "fed", newSigner("friend").Public())
	if err != nil {
		t.Fatal(err)
	}
	forged, err := federated.JoinToken(newSigner("not the gate"), "fed", newSigner("stranger").Public())
	if err != nil {
		t.Fatal(err)
	}
	for name, token := range map[string][]byte{"no token": nil, "another key's token": someoneElses, "a token not the authority's": forged} {
		if _, err := stranger.Join(ctx, token); !errors.Is(err, fedclient.ErrRefused) {
			t.Errorf("%s: join %v, want %v", name, err, fedclient.ErrRefused)
		}
	}
	if _, err := stranger.SecAggRound(ctx, 0, ones(info.Params, 0.001), 1, 2, 0, fedclient.SecAggHooks{}); !errors.Is(err, federated.ErrNotMember) {
		t.Fatalf("a stranger's secure aggregation round: %v, want %v", err, federated.ErrNotMember)
	}
	token, err := federated.JoinToken(gate, "fed", newSigner("friend").Public())
	if err != nil {
		t.Fatal(err)
	}
	friend := fedclient.New(url, "fed", newSigner("friend"))
	if _, err := friend.Join(ctx, token); err != nil {
		t.Fatalf("joining with the authority's token: %v", err)
	}
	if _, err := friend.Join(ctx, token); err != nil {
		t.Fatalf("joining again: %v", err)
	}
}

// TestOnRunTellsOfEveryRun: WithOnRun hears of each federated run once
// the service holds it (its first config, or its state loaded at start),
// and of nothing else: psyche server builds the browser trainer's module
// on the first, and a server with no federated run builds none.
func TestOnRunTellsOfEveryRun(t *testing.T) {
	dir := t.TempDir()
	admin := newSigner("admin")
	acc := newAccounts(t, admin.Public())
	var told []string
	open := func() *http.ServeMux {
		svc, err := New(dir, acc.get, WithOnRun(func(id string) { told = append(told, id) }))
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		svc.Routes(mux)
		return mux
	}
	mux := open()
	if len(told) != 0 {
		t.Fatalf("told of %v with no federated run", told)
	}
	if code, _, _ := post(t, mux, federated.KindJoin, 1, nil, newSigner("early")); code == http.StatusOK {
		t.Fatal("a join before any config was taken")
	}
	if len(told) != 0 {
		t.Fatalf("told of %v after a refused join", told)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if code, body, _ := post(t, mux, federated.KindConfig, seq, federated.EncodeConfig(&federated.Config{Capacity: 2, RoundDuration: 1}), admin); code != http.StatusOK {
			t.Fatalf("config %d: %d %s", seq, code, body)
		}
	}
	if !slices.Equal(told, []string{"fed"}) {
		t.Fatalf("after a config and a reconfig: told of %v, want [fed]", told)
	}
	told = nil
	open()
	if !slices.Equal(told, []string{"fed"}) {
		t.Fatalf("after a restart: told of %v, want [fed]", told)
	}
}
