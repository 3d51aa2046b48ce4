package localrun

import (
	"context"
	"slices"
	"sync"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/psyche-go/psyche/trainer/start"
)

// Trainers starts a run's trainers, one after another: trainer i has the
// keys Keys derives for i, and dials every trainer started before it, as a
// machine joining a run dials those it knows.
type Trainers struct {
	runID   string
	backend chain.Backend
	keys    Keys
	o       options
	addrs   []string             // every started trainer's addresses, in order
	earlier []coordinator.Pubkey // their signers (WithJoinOrder)
	list    []*Trainer
}

// NewTrainers prepares run runID's trainers on backend b. Options:
// WithLogger, WithClock, WithMemnet, WithLibp2pOptions, WithNodeOptions,
// WithTrainerOptions, WithCheckpointDir, WithJoinOrder.
func NewTrainers(runID string, b chain.Backend, keys Keys, opts ...Option) *Trainers {
	return &Trainers{runID: runID, backend: b, keys: keys, o: newOptions(opts)}
}

// Trainer is one started trainer: its node, not yet running (Go runs it),
// and its network.
type Trainer struct {
	Index  int
	Signer *chain.Keypair
	Node   *node.Node
	Net    p2p.Network
	leave  func()
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start starts the next n trainers (their indexes follow the last one's),
// each with the options of every trainer, then its own (WithTrainerOptions,
// then perTrainer's), and returns them. ctx bounds their libp2p hosts'
// lives.
func (ts *Trainers) Start(ctx context.Context, n int, perTrainer ...func(i int) []node.Option) ([]*Trainer, error) {
	first := len(ts.list)
	for i := first; i < first+n; i++ {
		t, err := ts.start(ctx, i, perTrainer)
		if err != nil {
			return nil, err
		}
		ts.list = append(ts.list, t)
		ts.addrs = append(ts.addrs, t.Net.Addrs()...)
		ts.earlier = append(ts.earlier, t.Signer.Public())
	}
	return ts.list[first:], nil
}

func (ts *Trainers) start(ctx context.Context, i int, perTrainer []func(int) []node.Option) (*Trainer, error) {
	t := &Trainer{Index: i, Signer: ts.keys.Trainer(i), done: make(chan struct{})}
	opts := []node.Option{node.WithPeers(ts.addrs...)}
	if ts.o.dir != "" {
		opts = append(opts, node.WithCheckpointDir(ts.o.dir))
	}
	if ts.o.log != nil {
		opts = append(opts, node.WithLogger(ts.o.log.With("trainer", i)))
	}
	if ts.o.clock != nil {
		opts = append(opts, node.WithClock(ts.o.clock))
	}
	if ts.o.ordered {
		opts = append(opts, node.WithJoinOrder(slices.Clone(ts.earlier)...))
	}
	opts = append(opts, ts.o.nodeOpts...)
	for _, f := range append(slices.Clone(ts.o.perTrainer), perTrainer...) {
		opts = append(opts, f(i)...)
	}
	if ts.o.hub != nil {
		mn := ts.o.hub.Join(ts.runID, ts.keys.P2P(i), t.Signer.Public())
		nd, err := node.New(ts.runID, ts.backend, t.Signer, mn, opts...)
		if err != nil {
			mn.Close()
			return nil, err
		}
		t.Node, t.Net, t.leave = nd, mn, mn.Close
		return t, nil
	}
	p2pOpts := []libp2p.Option{libp2p.WithListenAddrs("/ip4/127.0.0.1/tcp/0"), libp2p.WithKey(ts.keys.P2P(i))}
	if ts.o.log != nil {
		p2pOpts = append(p2pOpts, libp2p.WithLogger(ts.o.log.With("trainer", i)))
	}
	nd, pn, err := start.Trainer(ctx, ts.runID, ts.backend, t.Signer, append(p2pOpts, ts.o.p2pOpts...), opts...)
	if err != nil {
		return nil, err
	}
	t.Node, t.Net, t.leave = nd, pn, func() { _ = pn.Close() }
	return t, nil
}

// All is every trainer started so far, in order.
func (ts *Trainers) All() []*Trainer { return ts.list }

// Close leaves the network with every trainer (Trainer.Close).
func (ts *Trainers) Close() {
	for _, t := range ts.list {
		t.Close()
	}
}

// Go runs the trainer's node until ctx ends, Stop stops it or it leaves by
// itself; Done is closed then, and Err is its result.
func (t *Trainer) Go(ctx context.Context) {
	ctx, t.cancel = context.WithCancel(ctx)
	go func() {
		t.err = t.Node.Run(ctx)
		close(t.done)
	}()
}

// Stop stops the trainer as a machine that fails stops: its node ends (if
// Go runs it) and it leaves the network, so the others' witnesses report it
// missing. Done says when its node has returned.
func (t *Trainer) Stop() {
	if t.cancel != nil {
		t.cancel()
	}
	t.Close()
}

// Close leaves the network (once; later calls do nothing).
func (t *Trainer) Close() { t.once.Do(t.leave) }

// Done is closed once the node Go runs has returned.
func (t *Trainer) Done() <-chan struct{} { return t.done }

// Err is the node's result, once Done is closed.
func (t *Trainer) Err() error { return t.err }
