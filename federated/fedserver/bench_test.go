package fedserver

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/fedclient"
)

// BenchmarkFederatedLoad is the federated half of scripts/bench-server: one
// service on loopback HTTP, measured in one run:
//
//   - "refused": 2,000 updates, each from a new key that never joined, 20
//     at a time: requests/s, p50/p99, and the bytes the state file gained
//     (0: a refusal is not stored);
//   - "accepted": 8 clients push 25 rounds of valid updates (capacity 8):
//     requests/s, p50/p99, and bytes written per accepted update;
//   - "reads": 2,000 GETs of the run's info and 200 of its model;
//   - "oversized": 16 connections at once each declaring a 64 MiB update to
//     this small run and sending nothing more: how many were refused from
//     the header, and the Go heap's growth while they were open.
//
// It reports figures (b.ReportMetric) and asserts nothing about time.
func BenchmarkFederatedLoad(b *testing.B) {
	const (
		workers  = 20
		refusals = 2_000
		clients  = 8
		rounds   = 25
		reads    = 2_000
		models   = 200
		oversize = 16
	)
	ctx := context.Background()
	dir := b.TempDir()
	admin := newSigner("admin")
	acc := newAccounts(b, admin.Public())
	svc, err := New(dir, acc.get)
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	svc.Routes(mux)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(l) }()
	defer hs.Close()
	url := "http://" + l.Addr().String()
	info, err := fedclient.New(url, "fed", admin).Configure(ctx, &federated.Config{Capacity: clients, RoundDuration: 1})
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(dir, "fed"+fileExt)
	size := func() int64 {
		fi, err := os.Stat(file)
		if err != nil {
			b.Fatal(err)
		}
		return fi.Size()
	}

	// run calls f(i) for i in [0, n) on workers goroutines and returns the
	// latencies (ms) and the wall time.
	run := func(n, workers int, f func(i int) error) ([]float64, time.Duration) {
		lat := make([]float64, n)
		next := make(chan int)
		var wg sync.WaitGroup
		start := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					t0 := time.Now()
					if err := f(i); err != nil {
						b.Error(err)
					}
					lat[i] = float64(time.Since(t0).Microseconds()) / 1000
				}
			}()
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		return lat, time.Since(start)
	}
	pct := func(v []float64, p float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}

	before := size()
	lat, d := run(refusals, workers, func(i int) error {
		c := fedclient.New(url, "fed", newSigner(fmt.Sprint("stranger ", i)))
		if _, _, err := c.Push(ctx, 0, 1, ones(info.Params+1, 1)); err == nil {
			return fmt.Errorf("a stranger's update was accepted")
		}
		return nil
	})
	b.ReportMetric(float64(refusals)/d.Seconds(), "req/s-refused")
	b.ReportMetric(pct(lat, 0.5), "p50-refused-ms")
	b.ReportMetric(pct(lat, 0.99), "p99-refused-ms")
	b.ReportMetric(float64(size()-before), "state-growth-refused-B")

	pushers := make([]*fedclient.Client, clients)
	for i := range pushers {
		pushers[i] = join(b, url, fmt.Sprint("client ", i))
	}
	var all []float64
	start := time.Now()
	for r := range rounds {
		lat, _ := run(clients, clients, func(i int) error {
			_, _, err := pushers[i].Push(ctx, uint64(r), 1, ones(info.Params, 1e-3))
			return err
		})
		all = append(all, lat...)
	}
	d = time.Since(start)
	b.ReportMetric(float64(clients*rounds)/d.Seconds(), "req/s-accepted")
	b.ReportMetric(pct(all, 0.5), "p50-accepted-ms")
	b.ReportMetric(pct(all, 0.99), "p99-accepted-ms")
	b.ReportMetric(float64(size()), "state-file-B")
	b.ReportMetric(float64(4*info.Params), "model-B")

	reader := fedclient.New(url, "fed", admin)
	lat, d = run(reads, workers, func(int) error { _, err := reader.Info(ctx); return err })
	b.ReportMetric(float64(reads)/d.Seconds(), "req/s-info")
	b.ReportMetric(pct(lat, 0.99), "p99-info-ms")
	lat, d = run(models, workers, func(int) error { _, _, err := reader.Model(ctx, -1); return err })
	b.ReportMetric(float64(models)/d.Seconds(), "req/s-model")
	b.ReportMetric(pct(lat, 0.99), "p99-model-ms")

	// Oversized declarations: a real request's header with its payload
	// length raised to 64 MiB, and no body.
	req, err := federated.EncodeRequest(federated.KindUpdate, "fed", 1, make([]byte, 8), newSigner("big"))
	if err != nil {
		b.Fatal(err)
	}
	head := slices.Clone(req[:federated.RequestHeaderSize])
	binary.LittleEndian.PutUint32(head[48:], 64<<20)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapInuse
	var refused, peak uint64
	var mu sync.Mutex
	run(oversize, oversize, func(int) error {
		conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(time.Minute))
		fmt.Fprintf(conn, "POST /v1/federated HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", len(head)+64<<20+96)
		if _, err := conn.Write(head); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		mu.Lock()
		defer mu.Unlock()
		peak = max(peak, m.HeapInuse)
		if resp.StatusCode == http.StatusRequestEntityTooLarge {
			refused++
		}
		return nil
	})
	b.ReportMetric(float64(refused), "oversized-refused")
	b.ReportMetric(float64(peak-min(peak, heap0))/(1<<20), "oversized-heap-growth-MB")
}
