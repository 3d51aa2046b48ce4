package localrun

import (
	"log/slog"

	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/internal/quietclock"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/p2p/memnet"
	"github.com/psyche-go/psyche/trainer/node"
)

// Option sets up StartServer or NewTrainers; each says which it concerns.
type Option func(*options)

type options struct {
	log        *slog.Logger
	clock      *quietclock.Clock
	serverOpts []server.Option
	hub        *memnet.Hub
	p2pOpts    []libp2p.Option
	nodeOpts   []node.Option
	perTrainer []func(i int) []node.Option
	dir        string
	ordered    bool
}

func newOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithLogger logs the server, and each trainer with its index (trainer=i);
// without it the server logs as it does by default and the trainers as
// their other options say.
func WithLogger(log *slog.Logger) Option { return func(o *options) { o.log = log } }

// WithClock runs in virtual time on clock: the server reads it, and ticks
// whenever it moves (not by itself); the trainers wait on it. Whoever
// holds the clock moves it (quietclock.Clock.Run).
func WithClock(clock *quietclock.Clock) Option { return func(o *options) { o.clock = clock } }

// WithServerOptions adds options to StartServer's server (who may create
// runs, how it draws seeds).
func WithServerOptions(opts ...server.Option) Option {
	return func(o *options) { o.serverOpts = append(o.serverOpts, opts...) }
}

// WithMemnet joins the trainers to an in-memory network (NewTrainers);
// without it each has its own libp2p host on 127.0.0.1.
func WithMemnet(hub *memnet.Hub) Option { return func(o *options) { o.hub = hub } }

// WithLibp2pOptions adds options to every trainer's libp2p host
// (NewTrainers, without WithMemnet).
func WithLibp2pOptions(opts ...libp2p.Option) Option {
	return func(o *options) { o.p2pOpts = append(o.p2pOpts, opts...) }
}

// WithNodeOptions adds options to every trainer (NewTrainers).
func WithNodeOptions(opts ...node.Option) Option {
	return func(o *options) { o.nodeOpts = append(o.nodeOpts, opts...) }
}

// WithTrainerOptions adds trainer i's own options, after every trainer's
// (NewTrainers).
func WithTrainerOptions(f func(i int) []node.Option) Option {
	return func(o *options) { o.perTrainer = append(o.perTrainer, f) }
}

// WithCheckpointDir is where the trainers write checkpoints (NewTrainers).
func WithCheckpointDir(dir string) Option { return func(o *options) { o.dir = dir } }

// WithJoinOrder makes the trainers join each epoch in the order they were
// started (node.WithJoinOrder), so that a run in virtual time with
// reproducible seeds trains the same batches on the same trainers every
// time (NewTrainers).
func WithJoinOrder() Option { return func(o *options) { o.ordered = true } }
