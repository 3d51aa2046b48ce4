package simscale

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// Network describes how the hosts' links are drawn. Each trainer draws its
// own; Server is the coordinator server's.
type Network struct {
	Name string
	// MinBps and MaxBps bound a trainer's link speed in bits per second,
	// the same up and down, drawn log-uniformly (equal: every link alike).
	MinBps, MaxBps float64
	// MinRTT and MaxRTT bound a trainer's round trip to a host like
	// itself; the round trip between two trainers is the mean of theirs.
	MinRTT, MaxRTT time.Duration
	// Loss is every trainer link's packet loss probability.
	Loss float64
	// SlowFraction of the trainers have SlowBps links instead (a few slow
	// links).
	SlowFraction float64
	SlowBps      float64
	// ServerBps is the server's link speed (0: MaxBps); its round trip is
	// drawn like a trainer's, and it loses no packets.
	ServerBps float64
}

// The networks scripts/sim-scale runs.
var (
	// Datacenter1G is the target network: every link 1 Gbit/s, 50 ms round
	// trips, no loss.
	Datacenter1G = Network{Name: "1G-50ms", MinBps: 1e9, MaxBps: 1e9, MinRTT: 50 * time.Millisecond, MaxRTT: 50 * time.Millisecond}
	// Internet is a spread of home and cloud links: 100 Mbit/s to 1 Gbit/s,
	// 20 to 200 ms round trips, 1% loss, and one trainer in twenty on a
	// 20 Mbit/s link.
	Internet = Network{Name: "internet", MinBps: 100e6, MaxBps: 1e9, MinRTT: 20 * time.Millisecond, MaxRTT: 200 * time.Millisecond,
		Loss: 0.01, SlowFraction: 0.05, SlowBps: 20e6, ServerBps: 1e9}
	// Loopback is one machine: 10 Gbit/s, 0.1 ms round trips.
	Loopback = Network{Name: "loopback", MinBps: 10e9, MaxBps: 10e9, MinRTT: 100 * time.Microsecond, MaxRTT: 100 * time.Microsecond}
)

// FetchOrder is the order in which a node starts the fetches it has
// waiting.
type FetchOrder string

const (
	// FetchArrival starts the oldest first (trainer/node's Node.startFetches
	// before it took the ring order): every node starts with the same
	// announcers, whose uplinks then carry every node's fetches while the
	// others' idle.
	FetchArrival FetchOrder = "arrival"
	// FetchRing starts with the announcer after this node on a ring of p2p
	// keys, then the next: at any time each uplink serves about as many
	// fetches as any other (trainer/node's Node.startFetches now, less its
	// 2 s patience for announcers that never come).
	FetchRing FetchOrder = "ring"
)

// Config is one simulation.
type Config struct {
	Trainers int // 1..coordinator.MaxClients
	Rounds   int // training rounds (total_steps); the first two apply nothing
	Seed     uint64
	Network  Network

	// PayloadBytes is the size of one result (FrameSize).
	PayloadBytes int64
	// StepTime is the compute of one sequence's training step; each
	// trainer trains one sequence a round (the global batch is Trainers).
	StepTime time.Duration
	// ApplyTime is the compute of applying one round's results, fixed plus
	// per result.
	ApplyTime, ApplyPerResult time.Duration
	// LoadTime is the time a trainer takes to load the model at warmup.
	LoadTime time.Duration
	// CheckpointBytes is the model a joiner fetches from the trainers
	// after the run (0: no joiner); CheckpointConcurrency the blocks it
	// has in flight (p2p/libp2p: 32).
	CheckpointBytes       int64
	CheckpointConcurrency int

	// MeshDegree is gossipsub's D (6 by default): each node relays an
	// announcement to this many peers.
	MeshDegree int
	// Reannounce is how often a node re-announces its results (p2p/libp2p:
	// 2 s).
	Reannounce time.Duration
	// MaxFetches and MaxFetchesPerPeer bound a node's fetches in flight
	// (trainer/node: 16 and 2).
	MaxFetches, MaxFetchesPerPeer int
	// FetchOrder is the order in which a node starts its fetches.
	FetchOrder FetchOrder
	// PullParallel is how many peers a pull asks at once (p2p/libp2p: 8);
	// PullTimeout bounds a pull (trainer/node: 2 s).
	PullParallel int
	PullTimeout  time.Duration

	// FluidStep is how often flow rates are recomputed (a flow that starts
	// on a busy network waits up to this long for its share).
	FluidStep time.Duration
	// BloomProbes is how many non-members are looked up in each witness's
	// participant bloom to measure its false-positive rate.
	BloomProbes int
	// Limit bounds the virtual time of the run.
	Limit time.Duration
}

// DefaultConfig is the target setting at n trainers: 1B-model frames
// (payload must still be set: see Llama1BFrame), 1 Gbit/s and 50 ms.
func DefaultConfig(n int) Config {
	return Config{Trainers: n, Rounds: 8, Seed: 1, Network: Datacenter1G,
		// A Llama-3.2-1B-shaped step of one 2048-token sequence on an H100
		// (docs/benchmarks.md: 734 ms, transfers included).
		StepTime: 734 * time.Millisecond, LoadTime: time.Second,
		MeshDegree: 6, Reannounce: 2 * time.Second, MaxFetches: 16, MaxFetchesPerPeer: 2, FetchOrder: FetchArrival, PullParallel: 8, PullTimeout: 2 * time.Second,
		FluidStep: 5 * time.Millisecond, BloomProbes: 256, Limit: 4 * time.Hour, CheckpointConcurrency: 32}
}

// Validate checks the config.
func (c *Config) Validate() error {
	var errs []error
	rule := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("simscale: "+format, args...))
		}
	}
	rule(c.Trainers >= 1 && c.Trainers <= coordinator.MaxClients,
		"%d trainers: the coordinator account holds 1 to %d clients an epoch (coordinator.MaxClients, a fixed array of the account layout)", c.Trainers, coordinator.MaxClients)
	rule(c.Rounds >= 3, "%d rounds: at least 3 (the first two apply nothing)", c.Rounds)
	rule(c.PayloadBytes > 0 && c.PayloadBytes <= p2p.MaxBlobBlocks*p2p.BlockSize, "payload of %d bytes", c.PayloadBytes)
	rule(c.StepTime >= 0 && c.ApplyTime >= 0 && c.ApplyPerResult >= 0 && c.LoadTime >= 0, "negative compute time")
	rule(c.Network.MinBps > 0 && c.Network.MaxBps >= c.Network.MinBps, "link speeds %g..%g bit/s", c.Network.MinBps, c.Network.MaxBps)
	rule(c.Network.MinRTT >= 0 && c.Network.MaxRTT >= c.Network.MinRTT, "round trips %v..%v", c.Network.MinRTT, c.Network.MaxRTT)
	rule(c.Network.Loss >= 0 && c.Network.Loss < 1, "loss %g", c.Network.Loss)
	rule(c.MeshDegree >= 1 && c.MaxFetches >= 1 && c.MaxFetchesPerPeer >= 1 && c.PullParallel >= 1, "mesh degree, fetch and pull bounds must be positive")
	rule(c.FetchOrder == FetchArrival || c.FetchOrder == FetchRing, "fetch order %q (arrival or ring)", c.FetchOrder)
	rule(c.Reannounce > 0 && c.PullTimeout > 0 && c.FluidStep > 0 && c.Limit > 0, "intervals must be positive")
	rule(c.CheckpointBytes >= 0 && (c.CheckpointBytes == 0 || c.CheckpointConcurrency >= 1), "checkpoint of %d bytes, %d blocks at a time", c.CheckpointBytes, c.CheckpointConcurrency)
	return errors.Join(errs...)
}

// unixBase is the coordinator's clock at virtual time 0.
const unixBase = 1_800_000_000

// Sim is one simulation in progress.
type Sim struct {
	cfg      Config
	sched    sched
	net      *network
	rng      *rand.Rand
	server   *server
	trainers []*trainer
	byP2P    map[coordinator.Pubkey]*trainer
	annBytes int // an announcement's encoded size
	met      metrics
	err      error // the first error a trainer's driver met; it ends the run
}

// fail records a trainer's driver error; the run stops at the next event.
func (s *Sim) fail(err error) {
	if err != nil && s.err == nil {
		s.err = err
	}
}

// unixNow is the coordinator's clock: whole seconds.
func (s *Sim) unixNow() uint64 { return unixBase + uint64(s.sched.now/time.Second) }

// Run simulates cfg and returns its report.
func Run(cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x51a1e)), byP2P: map[coordinator.Pubkey]*trainer{}}
	s.met.init(cfg.Rounds)
	s.net = &network{s: &s.sched, rng: rand.New(rand.NewPCG(cfg.Seed, 0x11e7)), step: cfg.FluidStep}
	for i := 0; i < cfg.Trainers; i++ {
		s.net.hosts = append(s.net.hosts, host{Link: s.drawLink(false)})
	}
	s.net.hosts = append(s.net.hosts, host{Link: s.drawLink(true)})
	var err error
	if s.annBytes, err = announcementSize(cfg.PayloadBytes); err != nil {
		return nil, err
	}
	if s.server, err = newServer(s, len(s.net.hosts)-1); err != nil {
		return nil, err
	}
	for i := 0; i < cfg.Trainers; i++ {
		t := newTrainer(s, i)
		s.trainers = append(s.trainers, t)
		s.byP2P[t.id.P2P] = t
	}
	for _, t := range s.trainers {
		t.start()
	}
	s.server.start()
	finished := s.sched.run(func() bool { return s.err != nil || s.server.over() }, cfg.Limit)
	if s.err != nil {
		return nil, s.err
	}
	if !finished {
		return nil, fmt.Errorf("simscale: %d trainers: the run did not finish its %d rounds within %v of virtual time (it is at step %d, %s)",
			cfg.Trainers, cfg.Rounds, cfg.Limit, s.server.state.Progress.Step, s.server.state.RunState)
	}
	r := s.report()
	if cfg.CheckpointBytes > 0 {
		if r.CheckpointOffer, err = s.offerCheckpoint(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// offerCheckpoint is what a joiner waits for the model once the run is
// over: it comes with a link drawn like a trainer's and fetches the
// checkpoint's 1 MiB blocks (p2p.BlockSize) from the trainers that hold
// it, CheckpointConcurrency at a time, as p2p/libp2p's FetchCheckpoint
// does over bitswap, which asks every connected holder and takes each
// block from one of them (here block i from trainer i mod N). Each block is
// a request and a flow on the same links as the round's traffic.
func (s *Sim) offerCheckpoint() (time.Duration, error) {
	j := len(s.net.hosts)
	s.net.hosts = append(s.net.hosts, host{Link: s.drawLink(false)})
	total := s.cfg.CheckpointBytes
	blocks := int((total + p2p.BlockSize - 1) / p2p.BlockSize)
	start := s.sched.now
	next, done := 0, 0
	var fetch func()
	fetch = func() {
		if next >= blocks {
			return
		}
		i := next
		next++
		holder := i % len(s.trainers)
		size := int(min(p2p.BlockSize, total-int64(i)*p2p.BlockSize))
		s.net.message(j, holder, 64, func() { // the want
			s.net.transfer(holder, j, size, nil, func() {
				done++
				fetch()
			})
		})
	}
	for range min(s.cfg.CheckpointConcurrency, blocks) {
		fetch()
	}
	if !s.sched.run(func() bool { return done == blocks }, s.sched.now+s.cfg.Limit) {
		return 0, fmt.Errorf("simscale: the joiner's checkpoint did not arrive (%d of %d blocks)", done, blocks)
	}
	return s.sched.now - start, nil
}

// drawLink draws a trainer's (or the server's) link.
func (s *Sim) drawLink(server bool) Link {
	n := s.cfg.Network
	bps := n.MinBps * math.Pow(n.MaxBps/n.MinBps, s.rng.Float64())
	rtt := n.MinRTT + time.Duration(s.rng.Float64()*float64(n.MaxRTT-n.MinRTT))
	loss := n.Loss
	switch {
	case server:
		bps, loss = n.ServerBps, 0
		if bps == 0 {
			bps = n.MaxBps
		}
	case n.SlowFraction > 0 && s.rng.Float64() < n.SlowFraction:
		bps = n.SlowBps
	}
	// Two hosts of round trip rtt: each holds a quarter of it (a half of
	// the one-way delay).
	return Link{Up: bps / 8, Down: bps / 8, Half: rtt / 4, Loss: loss}
}

// announcementSize is the encoded size of an announcement of a payload of
// size bytes (p2p's wire format: it grows with the payload's block count).
func announcementSize(size int64) (int, error) {
	blocks := (size + p2p.BlockSize - 1) / p2p.BlockSize
	a := p2p.Announcement{RunID: runID, Blob: p2p.BlobRef{Size: uint64(size), Blocks: make([]coordinator.Hash, blocks)}}
	for i := range a.Blob.Blocks {
		a.Blob.Blocks[i][0], a.Blob.Blocks[i][1] = byte(i), byte(i>>8) // distinct, as real digests are
	}
	b, err := a.MarshalBinary()
	return len(b), err
}

// runID names the simulated run.
const runID = "sim-scale"

// identity is trainer i's client id: keys derived from the seed (nothing
// is signed in the simulation, so they need no private halves). They are
// not localrun.Keys' (whose ids are ed25519 public keys): the server's
// deltas carry the ids' bytes, so other ids would change the simulated
// byte counts and every report made so far.
func identity(seed uint64, i int) coordinator.ClientID {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	binary.LittleEndian.PutUint64(b[8:], uint64(i))
	return coordinator.ClientID{Signer: sha256.Sum256(append([]byte("signer"), b[:]...)), P2P: sha256.Sum256(append([]byte("p2p"), b[:]...))}
}
