package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/psyche-go/psyche/internal/httpserve"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newRegistry is a process's metrics registry: the packages' Metrics
// (p2p.NewMetrics, node.NewMetrics, server.NewMetrics) register into it,
// beside the Go runtime's and the process's own.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves reg at /metrics, and Go's profiles at /debug/pprof/,
// on addr until ctx ends.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry) (net.Addr, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Go's profiles beside the metrics, for whoever may scrape them (bind
	// the address to localhost): go tool pprof http://ADDR/debug/pprof/profile
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	// A scraper needs one connection: small caps keep strangers who find
	// the port from holding many (8 from one address, 64 in all; past them
	// an idle connection gives way to a new one, internal/httpserve), with
	// the public listeners' header (10 s) and idle (2 min) timeouts.
	lim := httpserve.Defaults
	lim.MaxConns, lim.MaxConnsPerAddr = 64, 8
	go func() { _ = lim.Serve(ctx, l, mux, time.Second) }()
	return l.Addr(), nil
}
