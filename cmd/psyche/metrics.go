package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
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

// serveMetrics serves reg at /metrics on addr until ctx ends.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry) (net.Addr, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// A scraper needs one connection: a small cap keeps strangers who find
	// the port from holding many.
	lim := httpserve.Defaults
	lim.MaxConns = 64
	go func() { _ = lim.Serve(ctx, l, mux, time.Second) }()
	return l.Addr(), nil
}
