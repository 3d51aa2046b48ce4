package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/store"
)

type config struct {
	log            *slog.Logger
	kernels        kernels.Backend
	precision      kernels.Precision
	engine         engine.Opener
	checkpoints    string
	peers          []string
	checkpointWait time.Duration
	progress       func(Progress)
	workers        int
	dataOpts       []data.Option
	storeAccess    *store.Access       // WithStoreAccess; nil: the environment's
	corrupt        func([]byte) []byte // fault injection in tests (export_test.go)
	// freeRide, in the adversary build, replaces the node's result with one
	// made from others' results of the step before (copies).
	freeRide     func(own []byte, others []*distro.Frame) []byte
	corruptShare func([]byte) // fault injection: the bytes of the model the node offers joiners (adversary build)
	// dataShift, in the adversary build, makes the node train on the data
	// indices this far past its assigned ones (wrong-data).
	dataShift uint64
	// publish replaces the network's Publish: fault injection in tests
	// (export_test.go).
	publish func(ctx context.Context, net p2p.Network, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error)
	// silent, in the adversary build, keeps the node from sending training
	// notices: with withhold, a trainer that says nothing of its batch.
	silent    bool
	epochs    int
	ticking   bool
	joinAfter []coordinator.Pubkey // WithJoinOrder
	joinFrom  uint32               // WithFirstEpoch (export_test.go)
	clock     Clock
	metrics   *Metrics
	noFinal   bool // WithoutFinalModel
}

// Clock is the time a node reads and paces itself by: the coordinator's
// timers are compared with Now, retries and ticks follow Ticker, and Work
// marks what the node is doing. The default is the wall clock (Work does
// nothing); a quietclock.Clock plays a whole run in virtual time that moves
// only while every part of it waits.
type Clock interface {
	Now() time.Time
	Ticker(period time.Duration) (<-chan time.Time, func())
	Work() (done func())
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Ticker(period time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(period)
	return t.C, t.Stop
}

func (wallClock) Work() func() { return func() {} }

// Option configures a Node.
type Option func(*config) error

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { c.log = l; return nil }
}

// WithPrecision sets the arithmetic of the matrix products (default
// kernels.FP32); a backend that cannot compute at it (the CPU backends, for
// bf16) computes in float32, and the node's first log line says so.
func WithPrecision(p kernels.Precision) Option {
	return func(c *config) error {
		c.precision = p
		return nil
	}
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

// WithCheckpointWait sets how long a joiner keeps trying to reach the
// previous epoch's clients for the model before it loads the run's
// checkpoint URL instead (default: half the run's warmup, at least 5 s).
func WithCheckpointWait(d time.Duration) Option {
	return func(c *config) error {
		c.checkpointWait = d
		return nil
	}
}

// WithPeers lists peer addresses (multiaddrs ending in /p2p/<id>) the node
// keeps dialling until connected: how trainers find each other without a
// discovery service. New checks that the network can read them.
func WithPeers(addrs ...string) Option {
	return func(c *config) error {
		c.peers = append(c.peers, addrs...)
		return nil
	}
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

// WithTicking makes the node send tick instructions itself whenever the
// coordinator's timers say a transition is due. A Solana run has no server
// that ticks it, so its trainers do (any signer may tick; a tick that finds
// nothing due, because another trainer's landed first, is refused with
// NothingDue in preflight and costs no fee).
func WithTicking() Option {
	return func(c *config) error { c.ticking = true; return nil }
}

// WithJoinOrder makes the node join each epoch only after every trainer
// of after has (each is in the run's pending list). The coordinator numbers
// an epoch's clients in the order they joined, and the number decides which
// batch each trains, so trainers that race to join train other batches
// every run; trainers started together that join in a fixed order number
// alike each time (localnet --virtual-time: a reproducible run). A trainer
// of after that never joins holds this one back for good.
func WithJoinOrder(after ...coordinator.Pubkey) Option {
	return func(c *config) error { c.joinAfter = slices.Clone(after); return nil }
}

// WithClock sets the node's clock (default: the wall clock).
func WithClock(c Clock) Option {
	return func(cfg *config) error {
		if c == nil {
			return errors.New("node: nil clock")
		}
		cfg.clock = c
		return nil
	}
}

// WithDataOptions passes options to the data provider.
func WithDataOptions(opts ...data.Option) Option {
	return func(c *config) error { c.dataOpts = append(c.dataOpts, opts...); return nil }
}

// WithoutFinalModel keeps Run from copying the engine's model out when it
// ends (a whole model in this process, for a torch engine): Model answers
// nil afterwards. A trainer that only trains (psyche join) never reads it.
func WithoutFinalModel() Option {
	return func(c *config) error { c.noFinal = true; return nil }
}

// WithEngine sets what computes (default: engine.Go with the node's
// kernels). The node loads every model on the host with its kernels and
// opens an engine on it; the engine then owns the parameters.
func WithEngine(o engine.Opener) Option {
	return func(c *config) error { c.engine = o; return nil }
}
