// Command sim-scale runs tools/simscale for several numbers of trainers
// and prints one table (scripts/sim-scale runs it).
package main

import (
	"flag"
	"fmt"
	"image/color"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/psyche-go/psyche/tools/simscale"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sim-scale:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		ns      = flag.String("n", "4,16,64,256", "numbers of trainers, comma-separated")
		rounds  = flag.Int("rounds", 8, "training rounds per run (the first two are not measured)")
		seed    = flag.Uint64("seed", 1, "seed of the links, the coordinator's round seeds and the bloom keys")
		network = flag.String("network", "1G-50ms", "links: 1G-50ms (the target), internet or loopback")
		step    = flag.Duration("step-time", 734*time.Millisecond, "compute of one trainer's step (one sequence); default: the Llama-3.2-1B shape on an H100, docs/benchmarks.md")
		apply   = flag.Duration("apply-time", 0, "compute of applying a round, fixed part")
		perRes  = flag.Duration("apply-per-result", 0, "compute of applying a round, per result")
		topk    = flag.Int("topk", 12, "DisTrO compression_topk of the 1B model's results")
		chunk   = flag.Int("chunk", 64, "DisTrO compression_chunk")
		payload = flag.Int64("payload", 0, "result size in bytes (0: the 1B model's frame at -topk and -chunk)")
		server  = flag.Float64("server-bps", 0, "the coordinator server's link in bit/s (0: the network's fastest)")
		fetches = flag.Int("max-fetches", 16, "fetches in flight per trainer (trainer/node: 16)")
		order   = flag.String("fetch-order", "arrival", "orders of a trainer's fetches, comma-separated, one table each: arrival (trainer/node before its ring order), ring (trainer/node now: each fetches the announcers after itself on a ring of keys)")
		seqs    = flag.Int("sequences", 1, "sequences each trainer trains a round (compute = step-time × sequences)")
		plot    = flag.String("plot", "", "write a PNG plot of round time and overhead against trainers to this file")
		detail  = flag.Bool("instructions", false, "also print the instructions per round by kind")
		ckptPar = flag.Int("checkpoint-concurrency", 32, "blocks a joiner has in flight (p2p/libp2p: 32)")
		ckpt    = flag.Int64("checkpoint", -1, "bytes of the model a joiner fetches from the trainers after each run (-1: the 1B model's float32 weights when the results are its frames, else none; 0: none)")
	)
	flag.Parse()
	nets := map[string]simscale.Network{"1G-50ms": simscale.Datacenter1G, "internet": simscale.Internet, "loopback": simscale.Loopback}
	netw, ok := nets[*network]
	if !ok {
		return fmt.Errorf("unknown network %q", *network)
	}
	if *server > 0 {
		netw.ServerBps = *server
	}
	size := *payload
	if size == 0 {
		typical, largest, err := simscale.FrameSize(simscale.Llama1B(), *chunk, *topk, *seed)
		if err != nil {
			return err
		}
		fmt.Printf("result frame of the Llama-3.2-1B shape at chunk %d, top-k %d, 1-bit, Rice indices: %d bytes (largest possible %d)\n",
			*chunk, *topk, typical, largest)
		size = typical
		if *ckpt < 0 {
			params := 0
			for _, shape := range simscale.Llama1B() {
				n := 1
				for _, d := range shape {
					n *= d
				}
				params += n
			}
			*ckpt = 4 * int64(params)
		}
	}
	*ckpt = max(*ckpt, 0)
	var series []simscale.Series
	colors := []color.RGBA{simscale.Blue, simscale.Orange, simscale.Green}
	for oi, o := range strings.Split(*order, ",") {
		reports, err := runAll(*ns, func(cfg *simscale.Config) {
			cfg.Rounds, cfg.Seed, cfg.Network, cfg.PayloadBytes = *rounds, *seed, netw, size
			cfg.StepTime, cfg.ApplyTime, cfg.ApplyPerResult, cfg.MaxFetches = *step*time.Duration(*seqs), *apply, *perRes, *fetches
			cfg.FetchOrder = simscale.FetchOrder(o)
			cfg.CheckpointBytes, cfg.CheckpointConcurrency = *ckpt, *ckptPar
		})
		if err != nil {
			return err
		}
		fmt.Printf("\nnetwork %s, fetch order %s, %d rounds measured per run, seed %d\n\n", netw.Name, o, reports[0].Rounds, *seed)
		simscale.WriteTable(os.Stdout, reports)
		if *detail {
			fmt.Println()
			simscale.WriteInstructions(os.Stdout, reports)
		}
		round, compute := simscale.Series{Color: colors[oi%len(colors)]}, simscale.Series{Color: simscale.Grey}
		for _, r := range reports {
			round.Points = append(round.Points, [2]float64{float64(r.Trainers), r.RoundTime.Seconds()})
			compute.Points = append(compute.Points, [2]float64{float64(r.Trainers), r.Compute.Seconds()})
		}
		if oi == 0 {
			series = append(series, compute)
		}
		series = append(series, round)
	}
	if *plot != "" {
		return simscale.Plot(*plot, series)
	}
	return nil
}

// runAll runs one simulation per number of trainers in ns.
func runAll(ns string, set func(*simscale.Config)) ([]*simscale.Report, error) {
	var reports []*simscale.Report
	for _, f := range strings.Split(ns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("-n: %w", err)
		}
		cfg := simscale.DefaultConfig(n)
		set(&cfg)
		began := time.Now()
		r, err := simscale.Run(cfg)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "%d trainers: %d events, %d flow steps, %.1f s\n", n, r.Events, r.FlowSteps, time.Since(began).Seconds())
		reports = append(reports, r)
	}
	return reports, nil
}
