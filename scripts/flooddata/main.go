// Command flooddata floods a data server (psyche server --data) with slow
// reads and measures what a fresh client gets meanwhile; scripts/flood-data
// runs it beside a server: run's trainers. It connects only to loopback
// (internal/floodtest), from 127.0.0.0/8 source addresses.
//
//	flooddata -addr 127.0.0.1:7600 -path /data/big.bin -from 2 -addrs 16 -per 17 -every 25s -read-for 1m \
//	    -rate 1024 -probe /data/opticks.bin -probe-from 127.0.0.100 -for 120s
//
// It prints one line of key=value figures when -for has passed: the
// flood's reads begun, refused (429) and cut by the server, and the fresh
// client's fetches, served and refused.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/psyche-go/psyche/internal/floodtest"
)

func main() {
	addr := flag.String("addr", "", "the server's host:port (a loopback address)")
	path := flag.String("path", "/data/big.bin", "what the flood reads")
	first := flag.Int("from", 2, "the flood's first source address, 127.0.0.FROM")
	addrs := flag.Int("addrs", 16, "the flood's source addresses")
	per := flag.Int("per", 17, "slow reads from each address")
	every := flag.Duration("every", 25*time.Second, "how often each flood connection asks again")
	readFor := flag.Duration("read-for", time.Minute, "how long a flood read is held at most (the server may end it first)")
	rate := flag.Int("rate", 1024, "bytes a second each slow read takes")
	probe := flag.String("probe", "/data/opticks.bin", "what the fresh client fetches")
	probeFrom := flag.String("probe-from", "127.0.0.100", "the fresh client's source address")
	probeEvery := flag.Duration("probe-every", 3*time.Second, "how often the fresh client fetches")
	hold := flag.Duration("for", 2*time.Minute, "how long the flood lasts")
	flag.Parse()
	if err := run(*addr, *path, floodtest.Loopback(*first, *addrs), *per, *every, *readFor, *rate, *probe, *probeFrom, *probeEvery, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "flooddata:", err)
		os.Exit(1)
	}
}

func run(addr, path string, from []string, per int, every, readFor time.Duration, rate int, probe, probeFrom string,
	probeEvery, hold time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), hold)
	defer cancel()
	f, err := floodtest.SlowReads(ctx, addr, from, per, path, every, readFor, rate)
	if err != nil {
		return err
	}
	var served, refused, failed int
	for ctx.Err() == nil {
		_, status, err := floodtest.Get(ctx, addr, probeFrom, probe, 30*time.Second)
		switch {
		case ctx.Err() != nil:
		case err == nil && status == http.StatusOK:
			served++
		case status == http.StatusTooManyRequests:
			refused++
		default:
			failed++
		}
		select {
		case <-ctx.Done():
		case <-time.After(probeEvery):
		}
	}
	f.Stop()
	begun, asks, cut, floodRefused := f.Counts()
	fmt.Printf("flood_asks=%d flood_begun=%d flood_refused=%d flood_cut=%d probe_served=%d probe_refused=%d probe_failed=%d\n",
		asks, begun, floodRefused, cut, served, refused, failed)
	return nil
}
