// Package node owns the trainer's client node: it follows a run's
// coordinator, joins every epoch, loads the model, trains its assigned batch
// each round, publishes the compressed result to its peers, fetches theirs,
// witnesses rounds when elected, applies each round's consensus results two
// rounds later, and records checkpoints when elected.
package node

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// Progress is what the node reports after each thing it does (for a progress
// display or metrics).
type Progress struct {
	State     coordinator.RunState
	Epoch     uint32
	Step      uint32
	Loss      float32 // loss of the last trained batch
	Tokens    uint64  // tokens trained by this node
	Sent      uint64  // result bytes published
	Received  uint64  // result bytes fetched
	Applied   uint64  // rounds applied
	Witnessed uint64  // witness reports sent
}

type config struct {
	log         *slog.Logger
	kernels     kernels.Backend
	checkpoints string
	peers       []string
	progress    func(Progress)
	workers     int
	dataOpts    []data.Option
	corrupt     func([]byte) []byte // fault injection in tests (export_test.go)
	epochs      int
}

// Option configures a Node.
type Option func(*config) error

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { c.log = l; return nil }
}

// WithKernels sets the kernels backend (default: kernels.Default()).
func WithKernels(k kernels.Backend) Option {
	return func(c *config) error { c.kernels = k; return nil }
}

// WithCheckpointDir is where the node saves checkpoints when it is elected
// checkpointer (default: no checkpoints are saved).
func WithCheckpointDir(dir string) Option {
	return func(c *config) error { c.checkpoints = dir; return nil }
}

// WithPeers lists peer addresses (multiaddrs ending in /p2p/<id>) the node
// keeps dialling until connected: how trainers find each other without a
// discovery service.
func WithPeers(addrs ...string) Option {
	return func(c *config) error { c.peers = append(c.peers, addrs...); return nil }
}

// WithEpochs makes the node leave after training n epochs (0: stay until the
// run finishes): it does not join the next one, and Run returns.
func WithEpochs(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("node: %d epochs", n)
		}
		c.epochs = n
		return nil
	}
}

// WithProgress receives progress reports.
func WithProgress(f func(Progress)) Option {
	return func(c *config) error { c.progress = f; return nil }
}

// WithDataOptions passes options to the data provider.
func WithDataOptions(opts ...data.Option) Option {
	return func(c *config) error { c.dataOpts = append(c.dataOpts, opts...); return nil }
}

// Node is one trainer.
type Node struct {
	cfg     config
	runID   string
	backend chain.Backend
	signer  chain.Signer
	net     p2p.Network

	mu   sync.Mutex // guards snap, for the p2p assignment check
	snap *coordinator.Coordinator

	id       coordinator.ClientID
	model    *gpt.Model
	opt      *distro.DeMo
	data     *data.Provider
	dataLoc  string
	results  map[uint32]map[uint64]*result // step → batch start → first verified result
	fetching map[coordinator.Hash]bool
	rejected map[coordinator.Hash]bool // results that failed their checks: never fetched again
	rounds   map[uint32]*roundState    // by step
	joined   uint32                    // epoch+1 of the last join sent (0: none)
	held     uint32                    // epoch+1 of the last epoch this node ended as a client
	ready    uint32                    // epoch+1 of the epoch the model was made ready for
	trained  int                       // epochs this node has ended as a client
	warmedUp uint32                    // epoch+1 of the last warmup witness sent
	ckpt     uint32                    // epoch+1 of the last checkpoint attempt
	progress Progress
	pulling  bool
}

// result is a verified peer (or own) result for one batch.
type result struct {
	ann   p2p.Announcement
	frame *distro.Frame
}

type roundState struct {
	trained, witnessed, applied, checked bool
}

// New creates a node for a run. The network must have been created with
// AssignmentCheck bound to this node's Assigned method (see p2p.WithAssignmentCheck).
func New(runID string, backend chain.Backend, signer chain.Signer, network p2p.Network, opts ...Option) (*Node, error) {
	cfg := config{log: slog.New(slog.DiscardHandler), workers: 2}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.kernels == nil {
		cfg.kernels = kernels.Default()
	}
	if _, err := coordinator.ParseRunID(runID); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, runID: runID, backend: backend, signer: signer, net: network,
		id:      coordinator.ClientID{Signer: signer.Public(), P2P: network.ID()},
		results: map[uint32]map[uint64]*result{}, fetching: map[coordinator.Hash]bool{}, rejected: map[coordinator.Hash]bool{},
		rounds: map[uint32]*roundState{}}
	return n, nil
}

// ID is the node's client identity.
func (n *Node) ID() coordinator.ClientID { return n.id }

// Model is the node's model (nil until loaded).
func (n *Node) Model() *gpt.Model { return n.model }

// Assigned is the p2p assignment check: trainer must be the client the
// current round (or one of the two before it) assigned this batch to.
func (n *Node) Assigned(step uint32, batch p2p.BatchRange, trainer coordinator.ClientID) error {
	n.mu.Lock()
	s := n.snap
	n.mu.Unlock()
	if s == nil {
		return errors.New("node: no coordinator state yet")
	}
	r, ok := roundForStep(s, step)
	if !ok {
		return fmt.Errorf("node: step %d is not a round the coordinator holds", step)
	}
	ranges := s.RoundAssignment(r)
	for i, d := range ranges {
		if d.Start == batch.Start && d.Start+d.Count == batch.End && d.Count > 0 {
			if i < int(s.Epoch.ClientsLen) && s.Epoch.Clients[i].ID == trainer {
				return nil
			}
			return errors.New("node: batch belongs to another trainer")
		}
	}
	return errors.New("node: no such batch in that round")
}

// roundForStep finds the ring round of a step of the current epoch. Rounds
// are trained at step = start step + height.
func roundForStep(s *coordinator.Coordinator, step uint32) (*coordinator.Round, bool) {
	if s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness && s.RunState != coordinator.Cooldown {
		return nil, false
	}
	if step < s.Epoch.StartStep {
		return nil, false
	}
	r := s.RoundAtHeight(step - s.Epoch.StartStep)
	return r, r != nil
}

func randomKey() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func (n *Node) report() {
	if n.cfg.progress != nil {
		n.cfg.progress(n.progress)
	}
}

// Run follows the run until it finishes, the node is dropped for good, or
// ctx ends.
func (n *Node) Run(ctx context.Context) error {
	snaps, err := n.backend.Subscribe(ctx, n.runID)
	if err != nil {
		return err
	}
	anns := n.net.Announcements()
	fetched := make(chan fetchResult, 16)
	pulled := make(chan []p2p.Announcement, 1)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			n.connectPeers(ctx)
			n.pullMissing(ctx, pulled)
		case list := <-pulled:
			n.pulling = false
			for _, a := range list {
				n.fetch(ctx, a, fetched)
			}
		case s, ok := <-snaps:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("node: the coordinator subscription ended")
			}
			done, err := n.onSnapshot(ctx, s.State)
			if err != nil {
				if ctx.Err() != nil {
					return nil // shutting down: the work in hand was interrupted, not failed
				}
				return err
			}
			if done {
				return nil
			}
		case a := <-anns:
			n.fetch(ctx, a, fetched)
		case f := <-fetched:
			n.onFetched(ctx, f)
		}
	}
}

type fetchResult struct {
	ann   p2p.Announcement
	frame *distro.Frame
	size  int
	err   error
}

// fetch starts fetching an announced result in the background.
func (n *Node) fetch(ctx context.Context, a p2p.Announcement, out chan<- fetchResult) {
	if n.fetching[a.Commitment] || n.rejected[a.Commitment] || a.Trainer == n.id {
		return
	}
	if got := n.results[a.Step][a.Batch.Start]; got != nil {
		return
	}
	n.fetching[a.Commitment] = true
	go func() {
		payload, err := n.net.Fetch(ctx, a)
		r := fetchResult{ann: a, err: err, size: len(payload)}
		if err == nil {
			r.frame, r.err = distro.DecodeFrame(payload, distro.DefaultLimits)
		}
		select {
		case out <- r:
		case <-ctx.Done():
		}
	}()
}

func (n *Node) onFetched(ctx context.Context, f fetchResult) {
	delete(n.fetching, f.ann.Commitment)
	if f.err == nil && n.opt != nil {
		f.err = n.opt.Check(f.frame)
	}
	if f.err != nil {
		if ctx.Err() == nil {
			n.rejected[f.ann.Commitment] = true
		}
		n.cfg.log.Warn("ignoring a peer's result", "step", f.ann.Step, "batch", f.ann.Batch.Start, "err", f.err)
		return
	}
	n.progress.Received += uint64(f.size)
	n.store(f.ann, f.frame)
	n.maybeWitness(ctx)
}

func (n *Node) store(a p2p.Announcement, f *distro.Frame) {
	m := n.results[a.Step]
	if m == nil {
		m = map[uint64]*result{}
		n.results[a.Step] = m
	}
	if m[a.Batch.Start] == nil {
		m[a.Batch.Start] = &result{ann: a, frame: f}
	}
}

// connectPeers dials the configured peers that are not connected (the
// allowlist refuses them until the coordinator lists them, so this is
// retried every second).
func (n *Node) connectPeers(ctx context.Context) {
	if len(n.cfg.peers) == 0 || len(n.net.Peers()) >= len(n.cfg.peers) {
		return
	}
	for _, addr := range n.cfg.peers {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := n.net.Connect(cctx, addr); err != nil {
			n.cfg.log.Debug("peer not reachable yet", "addr", addr, "err", err)
		}
		cancel()
	}
}

// pullMissing asks peers directly for the current round's announcements when
// some result has not arrived by gossip (the fallback for lost messages). It
// runs in the background; what it finds comes back on out.
func (n *Node) pullMissing(ctx context.Context, out chan<- []p2p.Announcement) {
	n.mu.Lock()
	s := n.snap
	n.mu.Unlock()
	if n.pulling || s == nil || (s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness) {
		return
	}
	step := s.Progress.Step
	missing := false
	for _, b := range expectedBatches(s, s.CurrentRound()) {
		missing = missing || n.results[step][b] == nil
	}
	if !missing {
		return
	}
	n.pulling = true
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		list, err := n.net.Pull(pctx, step)
		if err != nil {
			n.cfg.log.Debug("pull", "step", step, "err", err)
		}
		select {
		case out <- list:
		case <-ctx.Done():
		}
	}()
}
