package server

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/floodtest"
)

// The flood benchmarks (scripts/bench-server flood) measure, in one run,
// how long a fresh client waits while one host floods a server process
// (this test binary in child mode, with the default caps). They report
// figures and assert nothing about time. Environment:
//
//	PSYCHE_FLOOD_WAIT  how long a fresh client waits before it is counted as not served (default 30s)
//	PSYCHE_FLOOD_HOLD  how long fresh clients are measured under the keep-alive flood (default 25s: more than one
//	                   of the flood's 20 s request cycles)

// floodRun creates a run on the server at url, for streams to follow.
func floodRun(b *testing.B, url, id string) {
	b.Helper()
	admin := backendtest.Key("admin")
	rid, _ := coordinator.ParseRunID(id)
	if _, err := serverclient.New(url, nil).Send(context.Background(), id, admin, nil, &coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: rid}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkServerFlood: a server process with the default caps (4,096
// connections, 256 per address; 1,024 streams, 64 per address), and
//
//   - 4,096 keep-alive connections from 127.0.0.1, each sending GET
//     /healthz every 20 s (dialled again at its next turn if the server
//     closed it): meanwhile, once a second for PSYCHE_FLOOD_HOLD, a fresh
//     client from another address (127.0.0.2) and one from the flooding
//     address itself each send GET /v1/runs/{id} on a new connection;
//   - then 16 addresses (127.0.0.1-16) x 64 event streams (each opened
//     again a second after the server refuses or ends it): ten fresh
//     addresses (127.0.1.x), one a second, each open a stream and wait for
//     its first event.
func BenchmarkServerFlood(b *testing.B) {
	wait := floodtest.EnvDuration("PSYCHE_FLOOD_WAIT", 30*time.Second)
	hold := floodtest.EnvDuration("PSYCHE_FLOOD_HOLD", 25*time.Second)
	url, _, kill := startChildProc(b, b.TempDir())
	defer kill()
	addr := strings.TrimPrefix(url, "http://")
	floodRun(b, url, "flood")
	ctx := context.Background()
	b.ResetTimer()
	if err := floodtest.MeasureKeepAlive(ctx, addr, []string{"127.0.0.1"}, 4096, "/healthz",
		[]floodtest.FreshSource{{From: "127.0.0.2", Name: "other"}, {From: "127.0.0.1", Name: "same"}}, "/v1/runs/flood",
		hold, wait, b.ReportMetric, "keepalive"); err != nil {
		b.Fatal(err)
	}
	if err := floodtest.MeasureStreams(ctx, addr, floodtest.Loopback(1, 16), 64, floodtest.Loopback(257, 10),
		"/v1/runs/flood/events", wait, b.ReportMetric, "streams"); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkServerFloodIPv6 is the stream flood from 16 addresses of one
// IPv6 /64 (fd64::1-16) against a server on [::1], and fresh clients from
// another /64 (fd64:0:0:1::1-10). It runs only where those addresses are
// assigned to the loopback interface: scripts/bench-server flood makes a
// network namespace of its own for it (unshare -rn), in which nothing but
// the loopback interface exists. PSYCHE_FLOOD_V6=1 says it is in one.
func BenchmarkServerFloodIPv6(b *testing.B) {
	if os.Getenv("PSYCHE_FLOOD_V6") != "1" {
		b.Skip("needs fd64::1-16 and fd64:0:0:1::1-10 on lo (scripts/bench-server flood)")
	}
	wait := floodtest.EnvDuration("PSYCHE_FLOOD_WAIT", 30*time.Second)
	url, _, kill := startChildProc(b, b.TempDir(), childListenEnv+"=[::1]:0")
	defer kill()
	addr := strings.TrimPrefix(url, "http://")
	floodRun(b, url, "flood")
	var from, fresh []string
	for i := range 16 {
		from = append(from, fmt.Sprintf("fd64::%x", i+1))
	}
	for i := range 10 {
		fresh = append(fresh, fmt.Sprintf("fd64:0:0:1::%x", i+1))
	}
	b.ResetTimer()
	if err := floodtest.MeasureStreams(context.Background(), addr, from, 64, fresh, "/v1/runs/flood/events", wait,
		b.ReportMetric, "v6streams"); err != nil {
		b.Fatal(err)
	}
}
