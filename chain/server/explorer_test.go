package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/coordinator"
)

// TestExplorerHooks: the page is served at GET paths the API does not
// claim (never for a POST, never instead of the API); runs are listed over
// HTTP; Subscribe in process delivers the current state, then each change,
// and ends when the run is freed, which WithOnFree's function hears of.
func TestExplorerHooks(t *testing.T) {
	page := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "the page") })
	freed := make(chan string, 2)
	s, hs := serveHTTP(t, WithPage(page), WithOnFree(func(id string) { freed <- id }))
	for _, c := range []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/", 200, "the page"},
		{"GET", "/app.js", 200, "the page"},
		{"GET", "/healthz", 200, "ok"},
		{"GET", "/v1/runs", 200, "[]"},
		{"POST", "/", 405, ""},
	} {
		req, _ := http.NewRequest(c.method, hs.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(b), c.body) {
			t.Errorf("%s %s: %d %q", c.method, c.path, resp.StatusCode, b)
		}
	}
	if _, err := New(t.TempDir(), WithPage(nil)); err == nil {
		t.Error("a nil page was accepted")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := serverclient.New(hs.URL, nil)
	admin := backendtest.Key("admin")
	if _, err := s.Subscribe(ctx, "watched"); !errors.Is(err, chain.ErrRunNotFound) {
		t.Fatalf("subscribing to a missing run: %v", err)
	}
	id, _ := coordinator.ParseRunID("watched")
	if _, err := client.Send(ctx, "watched", admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id}); err != nil {
		t.Fatal(err)
	}
	if ids, err := client.Runs(ctx); err != nil || len(ids) != 1 || ids[0] != "watched" {
		t.Fatalf("runs %v, %v", ids, err)
	}
	snaps, err := s.Subscribe(ctx, "watched")
	if err != nil {
		t.Fatal(err)
	}
	first := <-snaps
	var meta coordinator.Metadata
	_ = coordinator.SetFixedString(meta.Name[:], "watched run")
	if _, err := client.Send(ctx, "watched", admin, nil, &coordinator.Update{Metadata: &meta}); err != nil {
		t.Fatal(err)
	}
	second := <-snaps
	if second.Nonce() <= first.Nonce() || coordinator.FixedString(second.State.Metadata.Name[:]) != "watched run" {
		t.Errorf("snapshots %d then %d (%q)", first.Nonce(), second.Nonce(), second.State.Metadata.Name[:12])
	}
	if _, err := client.Send(ctx, "watched", admin, nil, &coordinator.FreeCoordinator{}); err != nil {
		t.Fatal(err)
	}
	for range snaps { // closed once the run is freed
	}
	if id := <-freed; id != "watched" || len(freed) != 0 {
		t.Errorf("WithOnFree heard of %q (and %d more), want watched once", id, len(freed))
	}
	down := serverclient.New("http://127.0.0.1:1", nil)
	if _, err := down.Runs(ctx); err == nil {
		t.Error("listing the runs of a server that is down succeeded")
	}
}
