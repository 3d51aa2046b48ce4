package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/node"
)

// metrics serves a trainer's counters in the Prometheus text format
// (version 0.0.4), written by hand: a handful of gauges and counters do not
// need a client library.
type metrics struct {
	mu   sync.Mutex
	prog node.Progress
	net  p2p.Network
}

func (m *metrics) set(p node.Progress) {
	m.mu.Lock()
	m.prog = p
	m.mu.Unlock()
}

func (m *metrics) write(w io.Writer) {
	m.mu.Lock()
	p := m.prog
	m.mu.Unlock()
	metric := func(name, kind, help string, v float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %g\n", name, help, name, kind, name, v)
	}
	metric("psyche_epoch", "gauge", "Current epoch of the run.", float64(p.Epoch))
	metric("psyche_step", "gauge", "Current step of the run.", float64(p.Step))
	metric("psyche_run_state", "gauge", "Run state (0 Uninitialized ... 7 Paused).", float64(p.State))
	metric("psyche_loss", "gauge", "Loss of the last batch this trainer trained.", float64(p.Loss))
	metric("psyche_tokens_total", "counter", "Tokens trained by this trainer.", float64(p.Tokens))
	metric("psyche_result_bytes_sent_total", "counter", "Bytes of results published.", float64(p.Sent))
	metric("psyche_result_bytes_received_total", "counter", "Bytes of peers' results fetched and accepted.", float64(p.Received))
	metric("psyche_rounds_applied_total", "counter", "Rounds whose consensus results were applied.", float64(p.Applied))
	metric("psyche_witness_reports_total", "counter", "Witness reports sent.", float64(p.Witnessed))
	metric("psyche_compute_seconds_total", "counter", "Time spent training batches and applying rounds (the rest of a round is coordination and networking).", p.Compute.Seconds())
	if m.net != nil {
		st := m.net.Stats()
		metric("psyche_p2p_peers", "gauge", "Connected peers.", float64(len(m.net.Peers())))
		metric("psyche_p2p_announcements_delivered_total", "counter", "Peers' announcements delivered.", float64(st.Delivered))
		metric("psyche_p2p_blobs_fetched_total", "counter", "Result blobs fetched.", float64(st.BlobsFetched))
		fmt.Fprintf(w, "# HELP psyche_p2p_announcements_rejected_total Announcements refused, by reason.\n# TYPE psyche_p2p_announcements_rejected_total counter\n")
		reasons := make([]string, 0, len(st.Rejected))
		for r := range st.Rejected {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		for _, r := range reasons {
			fmt.Fprintf(w, "psyche_p2p_announcements_rejected_total{reason=%q} %d\n", r, st.Rejected[r])
		}
	}
}

// serveMetrics serves /metrics on addr until ctx ends.
func serveMetrics(ctx context.Context, addr string, m *metrics) (net.Addr, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		m.write(w)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return l.Addr(), nil
}
