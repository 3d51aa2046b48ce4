package simscale

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// Report is what one simulation measured over its measured rounds (2 to
// Rounds-1), per round unless said otherwise.
type Report struct {
	Trainers     int
	Network      string
	PayloadBytes int64
	Rounds       int // measured

	// RoundTime is the mean time from one round's start to the next's
	// (RoundTrain to RoundTrain at the coordinator); RoundTimeMax the
	// longest.
	RoundTime, RoundTimeMax time.Duration
	// Compute is the slowest trainer's compute in a round: its training
	// step and its apply.
	Compute time.Duration
	// Overhead is RoundTime less Compute: what coordination and the
	// network add.
	Overhead time.Duration
	// The parts, each the mean time from the round's start: the last
	// result published, the last trainer holding every result, the last
	// witness report accepted; and Apply, the mean time a trainer spends
	// applying a round.
	Published, LastResultIn, WitnessesIn, Apply time.Duration

	// Per trainer: bytes and messages sent and received, and pulls.
	SentBytes, RecvBytes, SentMsgs, RecvMsgs, Pulls float64
	// ServerBytes is what the coordinator server sent (snapshots, answers);
	// Snapshots the snapshot events it streamed.
	ServerBytes, Snapshots float64
	// SlowStreams counts snapshot events that took longer than the
	// server's slow-subscriber limit to write (chain/server drops those
	// streams); whole run.
	SlowStreams uint64

	WitnessReports float64 // accepted witness reports
	// QuorumMisses counts (client, round) pairs counted by fewer witnesses
	// than the quorum (a health check would drop them); QuorumFails the
	// rounds that ended with fewer reports than the quorum. Both totals.
	QuorumMisses, QuorumFails int
	// BloomFP is the measured false-positive rate of the witnesses'
	// participant blooms (non-members looked up); BloomFPTheory the rate
	// the bloom's size predicts for this many members.
	BloomFP, BloomFPTheory float64
	// HealthDrops and HealthRefused are health checks accepted (a client
	// dropped) and refused, over the whole run.
	HealthDrops, HealthRefused int
	MissingResults             int // results a quorum counted that a trainer applied without (whole run)

	// Instructions are those the server accepted, by kind (ticks by the
	// transition they made), and Refused those it refused, by name.
	Instructions, Refused map[string]float64
	// ComputeUnits is what those instructions cost on Solana, at the
	// compute units scripts/bench-program measured (interpolated in the
	// number of clients between its 4, 64 and 256).
	ComputeUnits float64

	// CheckpointOffer is how long a joiner took to fetch the model from
	// the trainers after the run (0: not simulated).
	CheckpointOffer time.Duration

	Events, FlowSteps uint64 // the simulation's own work
}

// theoryFP is the false-positive rate of a bloom of m bits and k hashes
// holding n members.
func theoryFP(n int) float64 {
	m, k := float64(coordinator.BloomWords*64), 7.0
	return math.Pow(1-math.Exp(-k*float64(n)/m), k)
}

func (s *Sim) report() *Report {
	m := &s.met
	cfg := &s.cfg
	n := cfg.Trainers
	r := &Report{Trainers: n, Network: cfg.Network.Name, PayloadBytes: cfg.PayloadBytes, Instructions: map[string]float64{},
		Refused: map[string]float64{}, SlowStreams: m.slowStreams, QuorumFails: m.quorumFails, HealthDrops: m.healthDrops,
		HealthRefused: m.healthRefus, MissingResults: m.missing, Events: s.sched.ran, FlowSteps: s.net.steps}
	var rounds int
	var sum struct{ round, pub, res, wit time.Duration }
	for step := m.first; step <= m.last; step++ {
		start, ok1 := m.started[step]
		end, ok2 := m.roundEnd[step]
		if !ok1 || !ok2 {
			continue
		}
		rounds++
		d := end - start
		sum.round += d
		r.RoundTimeMax = max(r.RoundTimeMax, d)
		sum.pub += m.lastPublish[step] - start
		sum.res += max(m.lastResult[step]-start, 0)
		sum.wit += m.witnessesIn[step] - start
		r.WitnessReports += float64(m.witnessReports[step])
		r.QuorumMisses += m.quorumMisses[step]
	}
	r.Rounds = rounds
	if rounds == 0 {
		return r
	}
	per := func(d time.Duration) time.Duration { return d / time.Duration(rounds) }
	r.RoundTime, r.Published, r.LastResultIn, r.WitnessesIn = per(sum.round), per(sum.pub), per(sum.res), per(sum.wit)
	r.WitnessReports /= float64(rounds)
	r.Pulls = float64(m.pulls) / float64(rounds) / float64(n)
	r.Apply = cfg.ApplyTime + time.Duration(n)*cfg.ApplyPerResult
	r.Compute = cfg.StepTime + r.Apply
	r.Overhead = r.RoundTime - r.Compute
	if m.bloomProbes > 0 {
		r.BloomFP = float64(m.bloomHits) / float64(m.bloomProbes)
	}
	r.BloomFPTheory = theoryFP(n)
	fr := float64(rounds)
	for i, h := range s.net.hosts {
		d := h.traffic
		d.sentBytes -= m.windowStart[i].sentBytes
		d.recvBytes -= m.windowStart[i].recvBytes
		d.sentMsgs -= m.windowStart[i].sentMsgs
		d.recvMsgs -= m.windowStart[i].recvMsgs
		if i == s.server.host {
			r.ServerBytes = d.sentBytes / fr
			continue
		}
		r.SentBytes += d.sentBytes / fr / float64(n)
		r.RecvBytes += d.recvBytes / fr / float64(n)
		r.SentMsgs += d.sentMsgs / fr / float64(n)
		r.RecvMsgs += d.recvMsgs / fr / float64(n)
	}
	costs, err := parseCosts(programCosts)
	if err != nil {
		panic(err) // the embedded table is checked by a test
	}
	for label, c := range m.ix {
		r.Instructions[label] = float64(c) / fr
		if row, ok := costs[label]; ok {
			r.ComputeUnits += float64(c) / fr * row.at(n)
		}
	}
	for name, c := range m.refused {
		r.Refused[name] = float64(c) / fr
	}
	return r
}

// InstructionsPerRound is the sum of Instructions.
func (r *Report) InstructionsPerRound() float64 {
	var t float64
	for _, v := range r.Instructions {
		t += v
	}
	return t
}

// WriteTable writes one row per report, the columns docs/scale.md reports.
func WriteTable(w io.Writer, reports []*Report) {
	fmt.Fprintln(w, "| trainers | round | compute | overhead | published | last result in | witnesses in | apply | MB sent / recv per trainer | msgs sent / recv per trainer | pulls per trainer | server MB | witness reports | quorum misses | bloom FP (theory) | health drops | instructions | CU (Solana) | joiner's checkpoint |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range reports {
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %s | %.1f / %.1f | %.0f / %.0f | %.1f | %.1f | %.1f | %d | %.2f%% (%.2f%%) | %d | %.1f | %.0f | %s |\n",
			r.Trainers, secs(r.RoundTime), secs(r.Compute), secs(r.Overhead), secs(r.Published), secs(r.LastResultIn), secs(r.WitnessesIn), secs(r.Apply),
			r.SentBytes/1e6, r.RecvBytes/1e6, r.SentMsgs, r.RecvMsgs, r.Pulls, r.ServerBytes/1e6, r.WitnessReports, r.QuorumMisses,
			100*r.BloomFP, 100*r.BloomFPTheory, r.HealthDrops, r.InstructionsPerRound(), r.ComputeUnits, offerTime(r.CheckpointOffer))
	}
}

// WriteInstructions writes each report's instructions per round by kind.
func WriteInstructions(w io.Writer, reports []*Report) {
	for _, r := range reports {
		var parts []string
		for k, v := range r.Instructions {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, v))
		}
		for k, v := range r.Refused {
			parts = append(parts, fmt.Sprintf("refused %s %.2f", k, v))
		}
		sort.Strings(parts)
		fmt.Fprintf(w, "%d trainers: %s\n", r.Trainers, strings.Join(parts, ", "))
	}
}

func offerTime(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return secs(d)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
