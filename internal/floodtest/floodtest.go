// Package floodtest floods a loopback HTTP listener the way one host can
// (many idle keep-alive connections that each send a request now and then;
// many event streams from many addresses) and measures how long a fresh
// client waits meanwhile. Tests and benchmarks use it (scripts/bench-server);
// nothing else should. It only ever connects to loopback addresses
// (127.0.0.0/8, ::1) and from loopback source addresses, or from the
// addresses a caller names (an isolated network namespace's), always to a
// loopback destination.
package floodtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// checkLoopback refuses any destination but a loopback address.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("floodtest: %q is not a loopback address", addr)
	}
	return nil
}

// dial connects to addr from the source address from ("" : any).
func dial(ctx context.Context, from, addr string) (net.Conn, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	return d.DialContext(ctx, "tcp", addr)
}

// Flood is a running flood; Stop ends it.
type Flood struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	open   atomic.Int64
	// counts
	served, dials, closed, refused atomic.Uint64
	// settled counts the KeepAlive connections whose first turn is over
	// (served, closed or not connected): served+closed counts a connection
	// served and then shed twice, so it says nothing of the ones still
	// arriving.
	settled atomic.Uint64
}

// Settled is how many of a KeepAlive flood's connections have had their
// first turn: once it is the flood's size, no connection of it is still
// arriving (none dials again before its next turn).
func (f *Flood) Settled() uint64 { return f.settled.Load() }

// Open is how many of the flood's connections (or streams) are open now.
func (f *Flood) Open() int { return int(f.open.Load()) }

// Counts are the flood's requests answered, connections dialled, closed by
// the server (or streams ended by it), and streams refused (429).
func (f *Flood) Counts() (served, dials, closedByServer, refused uint64) {
	return f.served.Load(), f.dials.Load(), f.closed.Load(), f.refused.Load()
}

// Stop ends the flood and closes its connections.
func (f *Flood) Stop() {
	f.cancel()
	f.wg.Wait()
}

// KeepAlive opens n keep-alive connections to addr, from the source
// addresses from in turn, each sending GET path and reading the answer,
// then again every every, until Stop or ctx ends. A connection the server
// closed is dialled again at its next turn (so at most one dial a turn: the
// loop is bounded by every). At most 64 dials are in flight at once, so the
// listener's backlog does not overflow.
func KeepAlive(ctx context.Context, addr string, from []string, n int, path string, every time.Duration) (*Flood, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, err
	}
	if len(from) == 0 {
		from = []string{""}
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &Flood{cancel: cancel}
	gate := make(chan struct{}, 64)
	for i := range n {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.keepAlive(ctx, addr, from[i%len(from)], path, every, gate)
		}()
	}
	return f, nil
}

// keepAlive is one connection of a KeepAlive flood. Between its requests
// it waits for the server to close the connection (as an idle client
// notices), and dials again at its next turn.
func (f *Flood) keepAlive(ctx context.Context, addr, src, path string, every time.Duration, gate chan struct{}) {
	var cur atomic.Pointer[net.Conn]
	stop := context.AfterFunc(ctx, func() {
		if c := cur.Load(); c != nil {
			_ = (*c).SetDeadline(time.Now())
		}
	})
	defer stop()
	var c net.Conn
	var r *bufio.Reader
	drop := func(byServer bool) {
		if byServer {
			f.closed.Add(1)
		}
		f.open.Add(-1)
		cur.Store(nil)
		c.Close()
		c = nil
	}
	defer func() {
		if c != nil {
			drop(false)
		}
	}()
	for first := true; ctx.Err() == nil; first = false {
		turn := time.Now().Add(every)
		if c == nil {
			if first {
				select {
				case gate <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
			var err error
			c, err = dial(ctx, src, addr)
			if first {
				<-gate
			}
			f.dials.Add(1)
			if err != nil {
				c = nil
			} else {
				f.open.Add(1)
				cur.Store(&c)
				r = bufio.NewReader(c)
				if ctx.Err() != nil { // cancelled before cur was set
					return
				}
			}
		}
		if c != nil {
			_ = c.SetDeadline(turn)
			if status, err := roundTrip(c, r, path); err == nil && status > 0 {
				f.served.Add(1)
				if first {
					f.settled.Add(1)
				}
				// Idle until the next turn; a read that ends before it is
				// the server closing the connection.
				if _, err := r.Peek(1); !errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
					drop(true)
				}
			} else {
				if ctx.Err() == nil {
					drop(true) // closed by the server, or too slow to answer
				}
				if first {
					f.settled.Add(1)
				}
			}
		} else if first {
			f.settled.Add(1)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(turn)):
		}
	}
}

// roundTrip sends GET path on c and reads the whole answer.
func roundTrip(c net.Conn, r *bufio.Reader, path string) (int, error) {
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: flood\r\n\r\n", path); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// Get sends one GET path to addr on a new connection from from, and
// returns how long the answer's status line took and its status. It waits
// at most wait.
func Get(ctx context.Context, addr, from, path string, wait time.Duration) (time.Duration, int, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	c, err := dial(ctx, from, addr)
	if err != nil {
		return time.Since(start), 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	status, err := roundTrip(c, bufio.NewReader(c), path)
	return time.Since(start), status, err
}

// Streams opens per event streams (GET path, text/event-stream) from each
// source address of from and holds them, reading their events, until Stop
// or ctx ends. A stream refused (429) or ended by the server is counted and
// opened again after every, so the flood takes back what it can (at most
// one attempt a stream every every).
func Streams(ctx context.Context, addr string, from []string, per int, path string, every time.Duration) (*Flood, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &Flood{cancel: cancel}
	gate := make(chan struct{}, 64)
	for _, src := range from {
		for range per {
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				for first := true; ctx.Err() == nil; first = false {
					if !first {
						select {
						case <-ctx.Done():
							return
						case <-time.After(every):
						}
					}
					select {
					case gate <- struct{}{}:
					case <-ctx.Done():
						return
					}
					f.dials.Add(1)
					held := f.hold(ctx, addr, src, path, func() { <-gate })
					if held && ctx.Err() == nil {
						f.closed.Add(1)
					}
				}
			}()
		}
	}
	return f, nil
}

// hold opens one stream and reads it until it ends; it says whether the
// stream was open (200). ready is called once the answer's status is in.
func (f *Flood) hold(ctx context.Context, addr, from, path string, ready func()) bool {
	c, err := dial(ctx, from, addr)
	if err != nil {
		ready()
		return false
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	r := bufio.NewReader(c)
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: flood\r\n\r\n", path); err != nil {
		ready()
		return false
	}
	resp, err := http.ReadResponse(r, nil)
	ready()
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode == http.StatusTooManyRequests {
			f.refused.Add(1)
		}
		return false
	}
	f.open.Add(1)
	defer f.open.Add(-1)
	_, _ = io.Copy(io.Discard, resp.Body)
	return true
}

// SlowReads has per connections from each source address of from ask for
// path every every, on a new connection each time, each answer read at rate
// bytes a second through a small receive buffer (a reader that holds a
// server's read open) until the server ends it or hold has passed: a
// reader that does not wait for its answers before it asks again. The
// connections' first asks are spread over the first turn, so that asks
// come all the time, not in bursts. It runs until Stop or ctx ends. Its
// counts: answers begun (served), asks (dials), answers the server ended
// before their whole body (closed; counted once the reader has read what
// the server sent before it), asks refused (429).
func SlowReads(ctx context.Context, addr string, from []string, per int, path string, every, hold time.Duration, rate int) (*Flood, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, err
	}
	if rate < 1 || every <= 0 || hold <= 0 {
		return nil, fmt.Errorf("floodtest: read rate %d, turn %v and hold %v must be positive", rate, every, hold)
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &Flood{cancel: cancel}
	n := len(from) * per
	for i := range n {
		src := from[i%len(from)]
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for wait := every * time.Duration(i) / time.Duration(n); ; wait = every {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
				f.dials.Add(1)
				read, end := context.WithTimeout(ctx, hold)
				f.wg.Add(1)
				go func() {
					defer f.wg.Done()
					defer end()
					f.slowRead(read, addr, src, path, rate)
				}()
			}
		}()
	}
	return f, nil
}

// slowRead asks for path once and reads the answer at rate bytes a second,
// 10 reads a second, until it ends or ctx does.
func (f *Flood) slowRead(ctx context.Context, addr, from, path string, rate int) {
	c, err := dial(ctx, from, addr)
	if err != nil {
		return
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: flood\r\n\r\n", path); err != nil {
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK, http.StatusPartialContent:
	case http.StatusTooManyRequests:
		f.refused.Add(1)
		return
	default:
		return
	}
	f.served.Add(1)
	f.open.Add(1)
	defer f.open.Add(-1)
	buf := make([]byte, max(rate/10, 1))
	for {
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				f.closed.Add(1)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ErrRefused is a stream the server refused (429).
var ErrRefused = errors.New("floodtest: stream refused (429)")

// FirstEvent opens an event stream (GET path) to addr from from and
// returns how long its first event ("data:" line) took, waiting at most
// wait. The stream is closed after it.
func FirstEvent(ctx context.Context, addr, from, path string, wait time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	c, err := dial(ctx, from, addr)
	if err != nil {
		return time.Since(start), err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	r := bufio.NewReader(c)
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: fresh\r\n\r\n", path); err != nil {
		return time.Since(start), err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return time.Since(start), err
	}
	// No resp.Body.Close: it would read the stream to its end. Closing
	// the connection (deferred) ends it.
	if resp.StatusCode == http.StatusTooManyRequests {
		return time.Since(start), ErrRefused
	}
	if resp.StatusCode != http.StatusOK {
		return time.Since(start), fmt.Errorf("floodtest: HTTP %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return time.Since(start), err
		}
		if strings.HasPrefix(line, "data:") {
			return time.Since(start), nil
		}
	}
}

// Loopback are n IPv4 loopback source addresses from 127.0.0.first on.
func Loopback(first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("127.0.%d.%d", (first+i)/256, (first+i)%256)
	}
	return out
}

// Report receives a benchmark's figures (testing.B.ReportMetric).
type Report func(v float64, unit string)

// Latencies are fresh clients' waits.
type Latencies struct {
	d      []time.Duration
	failed int
}

// Add records one wait; a client not served counts as waiting at least
// wait.
func (l *Latencies) Add(d time.Duration, ok bool, wait time.Duration) {
	if !ok {
		l.failed++
		d = max(d, wait)
	}
	l.d = append(l.d, d)
}

// Report reports the median and longest wait (ms), the tries and how many
// were not served, under prefix.
func (l *Latencies) Report(report Report, prefix string) {
	if len(l.d) == 0 {
		return
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	report(float64(s[len(s)/2].Microseconds())/1000, prefix+"-p50-ms")
	report(float64(s[len(s)-1].Microseconds())/1000, prefix+"-max-ms")
	report(float64(len(s)), prefix+"-tries")
	report(float64(l.failed), prefix+"-not-served")
}

// WaitFor polls cond until it holds or limit passes, and says whether it
// held.
func WaitFor(limit time.Duration, cond func() bool) bool {
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// FreshSource is where a fresh client comes from, and the name its
// figures are reported under.
type FreshSource struct{ From, Name string }

// MeasureKeepAlive floods addr with conns keep-alive connections from
// floodFrom (GET floodPath every 20 s) and, once a second for hold, sends
// GET freshPath on a new connection from each fresh source; it reports the
// setup time, the flood's counts and the fresh clients' waits under prefix.
func MeasureKeepAlive(ctx context.Context, addr string, floodFrom []string, conns int, floodPath string,
	fresh []FreshSource, freshPath string, hold, wait time.Duration, report Report, prefix string) error {
	start := time.Now()
	ka, err := KeepAlive(ctx, addr, floodFrom, conns, floodPath, 20*time.Second)
	if err != nil {
		return err
	}
	defer ka.Stop()
	WaitFor(2*time.Minute, func() bool { served, _, closed, _ := ka.Counts(); return served+closed >= uint64(conns) })
	report(time.Since(start).Seconds(), prefix+"-setup-s")
	lat := make([]Latencies, len(fresh))
	for end := time.Now().Add(hold); time.Now().Before(end); {
		for i, f := range fresh {
			d, status, err := Get(ctx, addr, f.From, freshPath, wait)
			lat[i].Add(d, err == nil && status == http.StatusOK, wait)
		}
		time.Sleep(time.Second)
	}
	served, dials, closed, _ := ka.Counts()
	report(float64(ka.Open()), prefix+"-flood-open")
	report(float64(served), prefix+"-flood-served")
	report(float64(dials), prefix+"-flood-dials")
	report(float64(closed), prefix+"-flood-closed")
	for i, f := range fresh {
		lat[i].Report(report, prefix+"-fresh-"+f.Name)
	}
	return nil
}

// MeasureStreams floods addr with per event streams (GET path) from each
// address of from, each opened again a second after the server refuses or
// ends it; then opens one stream from each address of fresh, a second
// apart, and reports how long their first events took, how long fresh
// clients were refused, and the flood's counts, under prefix.
func MeasureStreams(ctx context.Context, addr string, from []string, per int, fresh []string, path string,
	wait time.Duration, report Report, prefix string) error {
	sf, err := Streams(ctx, addr, from, per, path, time.Second)
	if err != nil {
		return err
	}
	defer sf.Stop()
	want := len(from) * per
	// Every stream open, or the rest refused (a per-address cap).
	WaitFor(2*time.Minute, func() bool {
		_, dials, _, refused := sf.Counts()
		return sf.Open() >= want || (dials >= uint64(want) && sf.Open()+int(refused) >= want)
	})
	report(float64(sf.Open()), prefix+"-flood-open")
	var l Latencies
	var first, last time.Time
	for _, src := range fresh {
		d, err := FirstEvent(ctx, addr, src, path, wait)
		if errors.Is(err, ErrRefused) {
			if first.IsZero() {
				first = time.Now()
			}
			last = time.Now()
		}
		l.Add(d, err == nil, wait)
		time.Sleep(time.Second)
	}
	_, _, ended, refused := sf.Counts()
	report(float64(ended), prefix+"-flood-ended-by-server")
	report(float64(refused), prefix+"-flood-refused")
	report(last.Sub(first).Seconds(), prefix+"-fresh-refused-for-s")
	l.Report(report, prefix+"-fresh")
	return nil
}

// EnvDuration is the duration in the environment variable name, or def.
// The flood benchmarks read PSYCHE_FLOOD_WAIT (how long a fresh client
// waits before it counts as not served) and PSYCHE_FLOOD_HOLD (how long
// fresh clients are measured under a keep-alive flood).
func EnvDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}
