package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/backendtest"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/chain/serverwire"
	"github.com/psyche-go/psyche/coordinator"
)

// BenchmarkServerLoad is scripts/bench-server: a server process (this test
// binary in child mode, its own RSS) under 20 concurrent signers, measured
// in one run:
//
//   - "100 keys": 2,000 requests from 100 anonymous keys (ticks with nothing
//     due and pauses by keys that are not the authority: the coordinator
//     refuses both);
//   - ten rounds, each of 1,000 requests from 1,000 new keys (10,000 new
//     keys in all) then 200 requests from the 100 keys again: each round's
//     p99 against the first figure shows whether requests slow down as the
//     keys the server has seen grow (they did when it stored them all), and
//     interleaving spreads the load of other processes on a shared machine
//     over both kinds of request;
//   - then 1,000 run creations by keys that may not create, each refused.
//
// It reports figures (b.ReportMetric) and asserts nothing about time: the
// script prints them with their targets.
func BenchmarkServerLoad(b *testing.B) {
	const (
		workers  = 20
		fewKeys  = 100
		manyKeys = 10_000
		fewReqs  = 2_000
		rounds   = 10
		afterReq = 200
		creates  = 1_000
	)
	admin := backendtest.Key("admin")
	pub := admin.Public()
	dir := b.TempDir()
	url, pid, kill := startChildProc(b, dir, childCreatorsEnv+"="+hex.EncodeToString(pub[:]))
	defer kill()
	ctx := context.Background()
	c := serverclient.New(url, nil)
	rid, _ := coordinator.ParseRunID("bench")
	k, m := backendtest.TinyConfig(), backendtest.TinyModel()
	for _, ix := range []coordinator.Instruction{&coordinator.InitCoordinator{MainAuthority: pub, RunID: rid},
		&coordinator.Update{Config: &k, Model: &m}, &coordinator.SetPaused{}} {
		if _, err := c.Send(ctx, "bench", admin, nil, ix); err != nil {
			b.Fatal(err)
		}
	}
	bind, err := fetchBinding(url, "bench")
	if err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	keys := func(prefix string, n int) []*chain.Keypair {
		out := make([]*chain.Keypair, n)
		for i := range out {
			out[i] = chain.KeypairFromSeed(sha256.Sum256([]byte(fmt.Sprintf("%s %d", prefix, i))))
		}
		return out
	}
	var seq atomic.Uint64
	seq.Store(uint64(time.Now().UnixNano()))
	// send posts one signed request and returns its latency; every
	// outcome but a transport error is expected (refusals are the point).
	send := func(ix coordinator.Instruction, id [coordinator.MaxRunIDLen]byte, bd serverwire.Binding, from *chain.Keypair, want int) time.Duration {
		body, err := serverwire.EncodeRequest(bd, id, seq.Add(1), coordinator.EncodeInstruction(ix), from, nil)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		resp, err := hc.Post(url+"/v1/instructions", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		reply, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if resp.StatusCode != want {
			b.Fatalf("%s: HTTP %d %s, want %d", ix.Name(), resp.StatusCode, reply, want)
		}
		return d
	}
	// phase runs n requests over the workers, the i-th from keys[i%len];
	// even ones tick (nothing is due: refused, 409 NothingDue), odd ones
	// pause (not the authority: refused, 409). Both are checked and answered
	// in full, which is the work measured.
	phase := func(ks []*chain.Keypair, n int) ([]time.Duration, time.Duration) {
		lat := make([]time.Duration, n)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= n {
						return
					}
					var ix coordinator.Instruction = &coordinator.Tick{}
					if i%2 == 1 {
						ix = &coordinator.SetPaused{Paused: true}
					}
					lat[i] = send(ix, rid, bind, ks[i%len(ks)], http.StatusConflict)
				}
			}()
		}
		wg.Wait()
		return lat, time.Since(start)
	}
	b.ResetTimer()
	few := keys("few", fewKeys)
	phase(few, 1_000) // warm the connections and the server
	rss0 := rssMB(b, pid)
	latFew, took := phase(few, fewReqs)
	many := keys("many", manyKeys)
	var latMany, latAfter []time.Duration
	var tookMany time.Duration
	per := manyKeys / rounds
	for r := range rounds {
		lat, d := phase(many[r*per:(r+1)*per], per)
		latMany, tookMany = append(latMany, lat...), tookMany+d
		b.ReportMetric(ms(pct(lat, 99)), fmt.Sprintf("p99-round%d-ms", r+1))
		lat, _ = phase(few, afterReq)
		latAfter = append(latAfter, lat...)
	}
	rss1 := rssMB(b, pid)
	// Run creations by keys that may not create: refused with 403.
	var wg sync.WaitGroup
	var next atomic.Int64
	creators := keys("creator", creates)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= creates {
					return
				}
				id, _ := coordinator.ParseRunID(fmt.Sprintf("anon-%d", i))
				send(&coordinator.InitCoordinator{MainAuthority: creators[i].Public(), RunID: id}, id,
					serverwire.Binding{Server: bind.Server, Incarnation: 1}, creators[i], http.StatusForbidden)
			}
		}()
	}
	wg.Wait()
	rss2 := rssMB(b, pid)
	b.StopTimer()
	files, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	runFile, err := os.Stat(runPath(dir, "bench"))
	if err != nil {
		b.Fatal(err)
	}
	var runs []string
	resp, err := hc.Get(url + "/v1/runs")
	if err == nil {
		_ = json.NewDecoder(resp.Body).Decode(&runs)
		resp.Body.Close()
	}
	b.ReportMetric(float64(fewReqs)/took.Seconds(), "req/s-100keys")
	b.ReportMetric(float64(manyKeys)/tookMany.Seconds(), "req/s-10kkeys")
	b.ReportMetric(ms(pct(latFew, 50)), "p50-100keys-ms")
	b.ReportMetric(ms(pct(latFew, 99)), "p99-100keys-ms")
	b.ReportMetric(ms(pct(latMany, 50)), "p50-10kkeys-ms")
	b.ReportMetric(ms(pct(latMany, 99)), "p99-10kkeys-ms")
	b.ReportMetric(ms(pct(latAfter, 50)), "p50-after-ms")
	b.ReportMetric(ms(pct(latAfter, 99)), "p99-after-ms")
	b.ReportMetric(rss0, "rss-start-MB")
	b.ReportMetric(rss1, "rss-10kkeys-MB")
	b.ReportMetric(rss2, "rss-1000refused-MB")
	b.ReportMetric(float64(len(files)), "files")
	b.ReportMetric(float64(runFile.Size())/1024, "runfile-KB")
	b.ReportMetric(float64(len(runs)), "runs")
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// rssMB is a process's resident set (Linux /proc), in MB.
func rssMB(b *testing.B, pid int) float64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// fetchBinding reads what requests for run id are signed for (GET
// /v1/runs/{id}/binding), as a client does before signing.
func fetchBinding(url, id string) (serverwire.Binding, error) {
	resp, err := http.Get(url + "/v1/runs/" + id + "/binding")
	if err != nil {
		return serverwire.Binding{}, err
	}
	defer resp.Body.Close()
	var info serverwire.BindingInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return serverwire.Binding{}, err
	}
	b := serverwire.Binding{Incarnation: info.Incarnation, Floor: info.Floor, Now: info.Now}
	if len(info.Server) != 2*len(b.Server) {
		return serverwire.Binding{}, fmt.Errorf("bad server identity %q", info.Server)
	}
	if _, err := hex.Decode(b.Server[:], []byte(info.Server)); err != nil {
		return serverwire.Binding{}, fmt.Errorf("bad server identity %q", info.Server)
	}
	return b, nil
}
