package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/explorer"
	"github.com/psyche-go/psyche/internal/floodtest"
)

// listenerGuard only stops a hung test: every wait below ends on an event.
const listenerGuard = 30 * time.Second

// floodThenFresh holds n idle keep-alive connections to addr from
// 127.0.0.1 (each served once, or closed by the listener) and checks that a
// fresh client, from another address and from the flooding one, is served
// GET path meanwhile.
func floodThenFresh(t *testing.T, addr string, n int, path string) {
	t.Helper()
	ctx := context.Background()
	flood, err := floodtest.KeepAlive(ctx, addr, []string{"127.0.0.1"}, n, path, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Stop()
	guard := time.Now().Add(listenerGuard)
	for {
		if flood.Settled() >= uint64(n) {
			break
		}
		if time.Now().After(guard) {
			t.Fatalf("the flood: %d of %d connections served or closed in %v", flood.Settled(), n, listenerGuard)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, from := range []string{"127.0.0.2", "127.0.0.1"} {
		if _, status, err := floodtest.Get(ctx, addr, from, path, listenerGuard); err != nil || status != http.StatusOK {
			t.Fatalf("a fresh client from %s while %d idle keep-alive connections were opened: %d %v", from, n, status, err)
		}
	}
}

// TestExplorerServesAFreshClientUnderAKeepAliveFlood: 2,048 idle keep-alive
// connections from one host (psyche explorer's whole connection cap; it was
// 1,024) leave room for a fresh client: the host holds at most 128, and past
// the total a newcomer takes an idle connection's place. Before, a fresh
// client waited until a flood connection closed (> 163 s when they sent a
// request every 20 s).
func TestExplorerServesAFreshClientUnderAKeepAliveFlood(t *testing.T) {
	floodThenFresh(t, startTestExplorer(t), explorer.ServeLimits.MaxConns, "/api/runs")
}

// startTestExplorer serves psyche explorer's listener (serveExplorer, with
// its caps) on 127.0.0.1 over a backend with no runs, until the test ends,
// and returns its address.
func startTestExplorer(tb testing.TB) string {
	ex, err := explorer.New()
	if err != nil {
		tb.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	src := explorer.NewSource(func(context.Context) ([]string, error) { return nil, nil },
		func(context.Context, string) (<-chan chain.Snapshot, error) { return nil, chain.ErrRunNotFound })
	go func() { done <- serveExplorer(ctx, l, ex, src, slog.New(slog.DiscardHandler)) }()
	tb.Cleanup(func() { cancel(); <-done })
	return l.Addr().String()
}

// TestMetricsServesAFreshClientUnderAKeepAliveFlood: the metrics listener
// (64 connections) with 64 idle keep-alive connections from one host still
// serves a scraper. Before, the scraper waited for one of them to close.
func TestMetricsServesAFreshClientUnderAKeepAliveFlood(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := serveMetrics(ctx, "127.0.0.1:0", newRegistry())
	if err != nil {
		t.Fatal(err)
	}
	floodThenFresh(t, addr.String(), 64, "/metrics")
}

// BenchmarkExplorerFlood (scripts/bench-server flood): psyche explorer's
// listener (serveExplorer, its caps: 2,048 connections, 128 per address;
// 1,024 streams, 64 per address) under 1,024 keep-alive connections from
// 127.0.0.1, each sending GET /api/runs every 20 s, while fresh clients
// from 127.0.0.2 and 127.0.0.1 send the same once a second for
// PSYCHE_FLOOD_HOLD; then 16 addresses x 64 streams of the run list and ten
// fresh addresses' streams. It reports figures and asserts nothing about
// time.
func BenchmarkExplorerFlood(b *testing.B) {
	wait := floodtest.EnvDuration("PSYCHE_FLOOD_WAIT", 30*time.Second)
	hold := floodtest.EnvDuration("PSYCHE_FLOOD_HOLD", 25*time.Second)
	addr := startTestExplorer(b)
	ctx := b.Context()
	b.ResetTimer()
	if err := floodtest.MeasureKeepAlive(ctx, addr, []string{"127.0.0.1"}, 1024, "/api/runs",
		[]floodtest.FreshSource{{From: "127.0.0.2", Name: "other"}, {From: "127.0.0.1", Name: "same"}}, "/api/runs",
		hold, wait, b.ReportMetric, "keepalive"); err != nil {
		b.Fatal(err)
	}
	if err := floodtest.MeasureStreams(ctx, addr, floodtest.Loopback(1, 16), 64, floodtest.Loopback(257, 10),
		"/api/runs/events", wait, b.ReportMetric, "streams"); err != nil {
		b.Fatal(err)
	}
}
