package libp2p

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

var (
	benchReport = flag.Bool("p2p.bench", false, "run the propagation and throughput report (scripts/bench-p2p)")
	benchNodes  = flag.String("p2p.bench.nodes", "4,16", "cluster sizes for the propagation report (empty: none)")
	benchRounds = flag.Int("p2p.bench.rounds", 3, "rounds per cluster size and payload")
	benchFetch  = flag.Bool("p2p.bench.fetch", true, "include the two 64 MiB fetches")
	benchOnly   = flag.Bool("p2p.bench.targets", false, "only the rounds that have a target")
	benchCkpt   = flag.Int("p2p.bench.ckpt", 2048, "MiB of the checkpoint fetched between two nodes (0 leaves it out)")
	benchWarmup = flag.Int("p2p.bench.warmup", 20, "at most this many unmeasured rounds before each measured set, until one touches almost no new memory")
)

// TestBenchReport prints round propagation, blob throughput and a
// checkpoint fetch (benchCheckpoint), each beside a reference measured in
// the same run: a plain TCP copy of the same bytes
// between two loopback sockets. The machine is shared, so each measurement is
// repeated (-p2p.bench.rounds), each one right next to its own TCP copies
// (for a round, the median of tcpCopies of them), and the report gives
// medians: of the times, and of the ratios of each pair.
// Beside the wall-clock ratio it gives the ratio of the process's CPU time
// (user and system) over the round and over its TCP copy: on a loaded
// machine the wall-clock ratio follows the share of the cores each one
// happened to get, while the CPU ratio is what the protocol costs per byte.
// It also gives the memory the round touched for the first time (minor
// page faults) per byte moved.
//
// Rounds are measured in the steady state of a long run: first come
// unmeasured rounds until one touches under 5% of its bytes in new memory
// (at most -p2p.bench.warmup). Until then the Go heap is still growing to
// its goal and every payload lands on fresh pages, which the kernel must
// fault in and zero (a third of the round's CPU at 8 × 10 MiB); a trainer
// reaches that state within its first rounds. The first round's ratio is
// printed as "cold".
//
// "floor" is the CPU that moving these bytes cannot avoid, over the TCP
// copy's: the TCP copy itself (every byte crosses loopback once), sealing
// and opening every byte with AES-128-GCM in TLS records, and hashing every
// received byte (BLAKE3, the block digest), each measured here on warm
// buffers. A round's CPU ratio can approach it, not beat it; on a machine
// whose cores the round fills, its wall-clock ratio follows the CPU ratio.
// Off unless -p2p.bench is given.
func TestBenchReport(t *testing.T) {
	if !*benchReport {
		t.Skip("run with -p2p.bench (scripts/bench-p2p)")
	}
	out := os.Stdout
	const big = 64 << 20
	fmt.Fprintf(out, "\nmedians of %d, each beside a plain TCP copy of the same bytes over loopback\n", *benchRounds)

	// Blob throughput between two nodes: over the blob stream from the
	// announcer (the fast path), then over bitswap alone (the fallback).
	for _, path := range []struct {
		name   string
		opts   []Option
		target string
	}{
		{"stream from the announcer", nil, ", target >= 400 MiB/s"},
		{"bitswap only (the fallback)", []Option{withoutStream()}, ""},
	} {
		if !*benchFetch {
			break
		}
		nodes := startCluster(t, 2, path.opts...)
		ctx := context.Background()
		var times, tcps, ratios []time.Duration
		for r := range *benchRounds {
			step := uint32(r + 1)
			nodes[0].SetStep(step)
			nodes[1].SetStep(step)
			payload := randomBytes(uint64(step), big)
			a, err := nodes[0].Publish(ctx, step, p2p.BatchRange{Start: 0, End: 1}, payload)
			if err != nil {
				t.Fatal(err)
			}
			tcp := tcpCopy(t, big)
			start := time.Now()
			if _, err := nodes[1].Fetch(ctx, a); err != nil {
				t.Fatal(err)
			}
			d := time.Since(start)
			times, tcps = append(times, d), append(tcps, tcp)
			ratios = append(ratios, ratio(d, tcp))
		}
		d, tcp := median(times), median(tcps)
		fmt.Fprintf(out, "blob fetch, %s, every block verified, %d MiB: %v (%.0f MiB/s%s); TCP %v (%.0f MiB/s); %.2fx the TCP copy's time\n",
			path.name, big>>20, d.Round(time.Millisecond), mibps(big, d), path.target, tcp.Round(time.Millisecond), mibps(big, tcp),
			float64(median(ratios))/100)
		for _, nd := range nodes {
			nd.kill(t)
		}
	}
	if *benchCkpt > 0 {
		benchCheckpoint(t, *benchCkpt<<20)
	}
	fmt.Fprintln(out)

	fmt.Fprintf(out, "%-6s %-8s %10s %10s %12s %14s %10s %8s %8s %8s %8s  %s\n", "nodes", "payload", "best", "median", "bytes moved", "TCP same bytes", "round/TCP", "CPU/TCP", "floor", "faulted", "cold", "target")
	for _, f := range strings.Split(*benchNodes, ",") {
		if strings.TrimSpace(f) == "" {
			continue // -p2p.bench.nodes "": no rounds
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatal(err)
		}
		cluster := startCluster(t, n, WithReannounceInterval(0))
		step := uint32(0)
		for _, size := range []int{1 << 20, 10 << 20} {
			target := roundTargets[[2]int{n, size >> 20}]
			if *benchOnly && target == "" {
				continue
			}
			moved := n * (n - 1) * size
			type measured struct{ d, ref, ratio, cpu, faulted, tcpCPU time.Duration }
			round := func() measured {
				step++
				payloads := roundPayloads(cluster, step, size)
				u0 := usage()
				d, u1 := runRoundOf(t, cluster, step, payloads)
				if t.Failed() {
					t.FailNow()
				}
				// The reference is the median of three copies: one copy's
				// time moves by a fifth from one second to the next here,
				// and every ratio inherits that from its reference.
				u1b := usage()
				refs := make([]time.Duration, tcpCopies)
				for i := range refs {
					refs[i] = tcpCopy(t, moved)
				}
				ref := median(refs)
				tcpCPU := (usage().cpu - u1b.cpu) / tcpCopies
				return measured{d, ref, ratio(d, ref), ratio(u1.cpu-u0.cpu, tcpCPU), time.Duration(100 * (u1.faulted - u0.faulted) / int64(moved)), tcpCPU}
			}
			cold := round()
			for w, last := 1, cold; w < *benchWarmup && last.faulted >= 5; w++ {
				last = round()
			}
			var times, refs, ratios, cpus, faulted, tcpCPUs []time.Duration
			for range *benchRounds {
				m := round()
				times, refs = append(times, m.d), append(refs, m.ref)
				ratios, cpus, faulted = append(ratios, m.ratio), append(cpus, m.cpu), append(faulted, m.faulted)
				tcpCPUs = append(tcpCPUs, m.tcpCPU)
			}
			tcpCPU := median(tcpCPUs)
			floor := ratio(tcpCPU+essentialCPU(t, moved), tcpCPU)
			fmt.Fprintf(out, "%-6d %-8s %10v %10v %9d MiB %14v %9.2fx %7.2fx %7.2fx %7.2fx %7.2fx  %s\n", n, fmt.Sprintf("%d MiB", size>>20),
				slices.Min(times).Round(time.Millisecond), median(times).Round(time.Millisecond), moved>>20,
				median(refs).Round(time.Millisecond), float64(median(ratios))/100, float64(median(cpus))/100,
				float64(floor)/100, float64(median(faulted))/100, float64(cold.ratio)/100, target)
		}
		for _, nd := range cluster {
			nd.kill(t)
		}
	}
}

// checkpointTensor is the size of each tensor of the benchmark's
// checkpoint: a model's large matrices.
const checkpointTensor = 64 << 20

// benchCheckpoint prints the time of a checkpoint of size bytes fetched by
// one node from another (FetchCheckpoint: streamed, and over bitswap alone,
// the fallback and what every fetch used before the stream), each beside a
// TCP copy of the same bytes measured right before it. Every round changes
// one byte of every block, so that nothing is held already; the sharer's
// next ShareCheckpoint and the fetcher's next fetch drop the last round's
// blocks, so memory stays at about twice size per node.
func benchCheckpoint(t *testing.T, size int) {
	out := os.Stdout
	size -= size % 4 // whole float32s
	data := randomBytes(4, size)
	var tensors []p2p.Tensor
	for off := 0; off < size; off += checkpointTensor {
		end := min(off+checkpointTensor, size)
		tensors = append(tensors, p2p.Tensor{Name: fmt.Sprintf("layer.%d.weight", len(tensors)), DType: "F32",
			Shape: []uint64{uint64(end-off) / 4}, Data: data[off:end:end]})
	}
	for _, path := range []struct {
		name   string
		opts   []Option
		target string
	}{
		{"streamed from the sharer", nil, ", target >= 800 MiB/s"},
		{"bitswap only (the fallback, and the fetch before streaming)", []Option{withoutStream()}, ""},
	} {
		nodes := startCluster(t, 2, path.opts...)
		ctx := context.Background()
		var times, tcps, ratios, cpus []time.Duration
		for r := range *benchRounds {
			for i := 0; i < size; i += p2p.BlockSize {
				data[i] = byte(r + 1)
			}
			id, err := nodes[0].ShareCheckpoint(ctx, uint32(r+1), p2p.TensorsSource(tensors))
			if err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			u0 := usage()
			tcp := tcpCopy(t, size)
			u1 := usage()
			f, err := p2p.NewCheckpointFile(p2p.SpecsOf(tensors))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = nodes[1].FetchCheckpoint(ctx, id, []coordinator.Pubkey{nodes[0].ID()}, f)
			d := time.Since(start)
			u2 := usage()
			if err != nil {
				t.Fatal(err)
			}
			got, err := p2p.ReadTensors(f)
			f.Close()
			if err != nil || len(got) != len(tensors) || !bytes.Equal(got[len(got)-1].Data, tensors[len(tensors)-1].Data) {
				t.Fatal("the fetched checkpoint differs", err)
			}
			times, tcps = append(times, d), append(tcps, tcp)
			ratios = append(ratios, ratio(d, tcp))
			cpus = append(cpus, ratio(u2.cpu-u1.cpu, u1.cpu-u0.cpu))
		}
		d, tcp := median(times), median(tcps)
		fmt.Fprintf(out, "checkpoint fetch, %s, every block verified, %d MiB: %v (%.0f MiB/s%s); TCP %v (%.0f MiB/s); %.2fx the TCP copy's time, %.2fx its CPU\n",
			path.name, size>>20, d.Round(time.Millisecond), mibps(size, d), path.target, tcp.Round(time.Millisecond), mibps(size, tcp),
			float64(median(ratios))/100, float64(median(cpus))/100)
		for _, nd := range nodes {
			nd.kill(t)
		}
	}
}

// ratio is a/b in hundredths (a Duration, so that median sorts it).
func ratio(a, b time.Duration) time.Duration {
	if b <= 0 {
		return 0
	}
	return time.Duration(100 * float64(a) / float64(b))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// tcpCopies is how many TCP copies of a round's bytes make its reference.
const tcpCopies = 3

// roundTargets are the targets for the round's time over the TCP copy of
// the same bytes, by nodes and MiB per result.
var roundTargets = map[[2]int]string{
	{4, 1}: "<= 1.5x", {4, 10}: "<= 1.5x", {16, 1}: "<= 1.5x", {16, 10}: "<= 1.5x",
}

func mibps(n int, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

// tcpCopy sends n bytes through a loopback TCP connection and returns the
// time from the first write to the last byte read.
func tcpCopy(t testing.TB, n int) time.Duration {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(io.Discard, c)
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	buf := randomBytes(2, 1<<20)
	start := time.Now()
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := c.Write(buf[:min(len(buf), n-sent)]); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// essentialCPU is the CPU that moving n bytes between two nodes costs
// beyond their TCP copy: AES-GCM sealing and opening in 16 KiB records
// (TLS's largest) and the digest (BLAKE3) of every 1 MiB block, measured on
// warm buffers.
func essentialCPU(t testing.TB, n int) time.Duration {
	u0 := usage()
	blk, err := aes.NewCipher(make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(blk)
	if err != nil {
		t.Fatal(err)
	}
	const record = 16 << 10
	src := randomBytes(3, p2p.BlockSize)
	sealed := make([]byte, 0, record+gcm.Overhead())
	opened := make([]byte, 0, record)
	nonce := make([]byte, gcm.NonceSize())
	for done := 0; done < n; done += record {
		off := done % p2p.BlockSize
		sealed = gcm.Seal(sealed[:0], nonce, src[off:off+record], nil)
		if opened, err = gcm.Open(opened[:0], nonce, sealed, nil); err != nil {
			t.Fatal(err)
		}
	}
	for done := 0; done < n; done += p2p.BlockSize {
		p2p.BlockDigest(src)
	}
	return usage().cpu - u0.cpu
}

// BenchmarkFetch is one blob of 64 MiB fetched from its announcer (over the
// blob stream, each block verified). Only Fetch is timed; every iteration
// publishes new bytes, so that nothing is held locally already.
func BenchmarkFetch(b *testing.B) {
	const size = 64 << 20
	nodes := startCluster(b, 2)
	ctx := context.Background()
	payload := randomBytes(1, size)
	b.SetBytes(size)
	b.ReportAllocs()
	step := uint32(0)
	for b.Loop() {
		b.StopTimer()
		step++
		for i := 0; i < size; i += p2p.BlockSize {
			payload[i] = byte(step) // a new digest for every block
		}
		nodes[0].SetStep(step)
		nodes[1].SetStep(step)
		a, err := nodes[0].Publish(ctx, step, p2p.BatchRange{Start: 0, End: 1}, slices.Clone(payload))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := nodes[1].Fetch(ctx, a); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFetchCheckpoint is a checkpoint of 256 MiB (four 64 MiB tensors)
// fetched from the node that shares it into a file. Only FetchCheckpoint is timed;
// every iteration changes every block, so that nothing is held already.
func BenchmarkFetchCheckpoint(b *testing.B) {
	const size = 256 << 20
	nodes := startCluster(b, 2)
	ctx := context.Background()
	data := randomBytes(5, size)
	var tensors []p2p.Tensor
	for off := 0; off < size; off += checkpointTensor {
		tensors = append(tensors, p2p.Tensor{Name: fmt.Sprintf("t%d", off/checkpointTensor), DType: "F32",
			Shape: []uint64{checkpointTensor / 4}, Data: data[off : off+checkpointTensor]})
	}
	b.SetBytes(size)
	b.ReportAllocs()
	epoch := uint32(0)
	for b.Loop() {
		b.StopTimer()
		epoch++
		for i := 0; i < size; i += p2p.BlockSize {
			data[i] = byte(epoch)
		}
		id, err := nodes[0].ShareCheckpoint(ctx, epoch, p2p.TensorsSource(tensors))
		if err != nil {
			b.Fatal(err)
		}
		f, err := p2p.NewCheckpointFile(p2p.SpecsOf(tensors))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := nodes[1].FetchCheckpoint(ctx, id, []coordinator.Pubkey{nodes[0].ID()}, f); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		f.Close()
		b.StartTimer()
	}
}
