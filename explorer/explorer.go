package explorer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/psyche-go/psyche/chain"
)

// Source is where the explorer finds runs and follows them.
type Source interface {
	// Runs lists the run ids to show. An error means the backend cannot be
	// reached: the page says so, and the explorer asks again.
	Runs(ctx context.Context) ([]string, error)
	// Subscribe delivers a run's snapshots (chain.Backend's contract).
	Subscribe(ctx context.Context, runID string) (<-chan chain.Snapshot, error)
}

type lister struct {
	runs func(ctx context.Context) ([]string, error)
	sub  func(ctx context.Context, runID string) (<-chan chain.Snapshot, error)
}

func (l lister) Runs(ctx context.Context) ([]string, error) { return l.runs(ctx) }
func (l lister) Subscribe(ctx context.Context, id string) (<-chan chain.Snapshot, error) {
	return l.sub(ctx, id)
}

// NewSource makes a Source of a run lister and a subscriber (for example a
// chain.Backend).
func NewSource(runs func(ctx context.Context) ([]string, error), sub func(ctx context.Context, runID string) (<-chan chain.Snapshot, error)) Source {
	return lister{runs: runs, sub: sub}
}

// FixedRuns is a Source for a backend that cannot list its runs (a Solana
// cluster): the given run ids, each checked with a snapshot, so that a
// backend that is down is reported and a run that does not exist is not
// listed.
func FixedRuns(b chain.Backend, ids ...string) Source {
	return NewSource(func(ctx context.Context) ([]string, error) {
		var out []string
		for _, id := range ids {
			_, err := b.Snapshot(ctx, id)
			switch {
			case err == nil:
				out = append(out, id)
			case errors.Is(err, chain.ErrRunNotFound):
			default:
				return nil, err
			}
		}
		return out, nil
	}, b.Subscribe)
}

type config struct {
	log        *slog.Logger
	now        func() time.Time
	refresh    time.Duration
	retry      time.Duration
	historyDir string
	epochLimit uint32 // WithEpochLimit; 0: none
}

// Option configures an Explorer.
type Option func(*config) error

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("explorer: nil logger")
		}
		c.log = l
		return nil
	}
}

// WithClock sets the run's clock, which the page counts timers down with
// (default: the wall clock; psyche localnet --virtual-time passes its own).
func WithClock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return errors.New("explorer: nil clock")
		}
		c.now = now
		return nil
	}
}

// WithHistoryDir keeps each run's per-step history (losses, rates,
// witnesses: the last MaxPoints steps) in files under dir, so that an
// explorer started again (the server's, after a restart) shows a run from
// its first step rather than from the restart (default: memory only).
func WithHistoryDir(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return errors.New("explorer: empty history directory")
		}
		c.historyDir = dir
		return nil
	}
}

// WithRefresh sets how often the run list is asked for again (default 2s;
// suggested 1s in process, a few seconds over a network).
func WithRefresh(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("explorer: refresh interval %v must be positive", d)
		}
		c.refresh = d
		return nil
	}
}

// WithEpochLimit says that the runs followed end after n epochs (epochs 0
// to n-1) whatever their total_steps: psyche localnet --epochs stops its
// trainers there (its run's total_steps is a bound nobody reaches). The
// view says so (total_epochs), and the page shows it in place of the
// total of steps.
func WithEpochLimit(n uint32) Option {
	return func(c *config) error {
		c.epochLimit = n
		return nil
	}
}

// Explorer follows runs and serves the page (Handler).
type Explorer struct {
	cfg config

	store *pointStore // nil: memory only

	mu      sync.Mutex
	runs    map[string]*runState
	listed  []string // the ids the source listed last
	listErr string
	lrev    uint64                     // bumped when the run list changes
	lsubs   map[chan struct{}]struct{} // run-list watchers
}

type runState struct {
	h         *history
	subs      map[chan struct{}]struct{}
	following bool // a follow goroutine runs
}

// New makes an explorer; Run feeds it.
func New(opts ...Option) (*Explorer, error) {
	cfg := config{log: slog.New(slog.DiscardHandler), now: time.Now, refresh: 2 * time.Second, retry: time.Second}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	e := &Explorer{cfg: cfg, runs: map[string]*runState{}, lsubs: map[chan struct{}]struct{}{}}
	if cfg.historyDir != "" {
		var err error
		if e.store, err = newPointStore(cfg.historyDir); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// newRun starts following run id's history: what the store kept of it, if
// anything. Callers hold e.mu.
func (e *Explorer) newRun(id string) *runState {
	r := &runState{h: newHistory(id), subs: map[chan struct{}]struct{}{}}
	if e.store != nil {
		points, err := e.store.load(id)
		if err != nil {
			e.cfg.log.Warn("reading a run's kept history", "run", id, "err", err)
		}
		if len(points) > 0 {
			r.h.restore(points)
		}
	}
	e.runs[id] = r
	return r
}

// keep writes run id's changed points to the store. Callers hold e.mu.
func (e *Explorer) keep(id string, r *runState) {
	changed := r.h.takeChanged()
	if e.store == nil || len(changed) == 0 {
		return
	}
	if err := e.store.save(id, changed, r.h.points); err != nil {
		e.cfg.log.Warn("keeping a run's history", "run", id, "err", err)
	}
}

// Run follows src's runs until ctx ends: it lists them every refresh
// interval and keeps one subscription per run, which it opens again when it
// breaks.
func (e *Explorer) Run(ctx context.Context, src Source) error {
	t := time.NewTicker(e.cfg.refresh)
	defer t.Stop()
	for {
		ids, err := src.Runs(ctx)
		if ctx.Err() != nil {
			return nil
		}
		e.setList(ctx, src, ids, err)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (e *Explorer) setList(ctx context.Context, src Source, ids []string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	msg := ""
	if err != nil {
		msg = "the backend cannot be reached: " + err.Error()
		if msg != e.listErr {
			e.cfg.log.Warn("listing runs", "err", err)
		}
		ids = e.listed // keep showing what was there
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	changed := msg != e.listErr || !slices.Equal(ids, e.listed)
	if msg != e.listErr {
		// Every run's page shows whether the backend can be reached.
		for _, r := range e.runs {
			r.h.rev++
			r.notify()
		}
	}
	e.listErr, e.listed = msg, ids
	for _, id := range ids {
		r, ok := e.runs[id]
		if !ok {
			r = e.newRun(id)
			changed = true
		}
		if !r.following {
			r.following = true
			go e.follow(ctx, src, id)
		}
	}
	if changed {
		e.listChanged()
	}
}

// follow subscribes to one run for as long as ctx lasts, again after every
// break (the history keeps only newer snapshots, so a replay is harmless).
func (e *Explorer) follow(ctx context.Context, src Source, id string) {
	for ctx.Err() == nil {
		snaps, err := src.Subscribe(ctx, id)
		if err == nil {
			for s := range snaps {
				if s.State != nil {
					e.observe(id, s)
				}
			}
			err = errors.New("the run's stream ended")
		}
		if ctx.Err() != nil || !e.setRunError(id, err) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(e.cfg.retry):
		}
	}
}

func (e *Explorer) observe(id string, s chain.Snapshot) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.runs[id]
	if r == nil {
		return
	}
	before := r.h.summary()
	if r.h.observe(s.State) {
		e.keep(id, r)
		r.notify()
		if r.h.summary() != before {
			e.listChanged()
		}
	}
}

// setRunError records why a run's stream broke. It reports whether to
// subscribe again: not to a run that is gone from the backend and its list
// (the next listing that names it follows it again).
func (e *Explorer) setRunError(id string, err error) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.runs[id]
	if r == nil {
		return false
	}
	msg := "the run's updates stopped (" + err.Error() + "); reconnecting"
	gone := errors.Is(err, chain.ErrRunNotFound)
	if gone {
		msg = "the run does not exist on the backend (any more)"
	}
	if r.h.view.Error != msg {
		r.h.view.Error = msg
		r.h.rev++
		r.notify()
		e.listChanged()
	}
	if gone && !slices.Contains(e.listed, id) {
		r.following = false
		return false
	}
	return true
}

// RecordHeldOut adds a held-out loss measured on the model of step (for
// example psyche localnet's, before and after training).
func (e *Explorer) RecordHeldOut(runID string, step, epoch uint32, loss float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.runs[runID]
	if r == nil {
		r = e.newRun(runID) // the run is listed (and followed) once the source lists it
	}
	r.h.heldOut(step, epoch, loss)
	e.keep(runID, r)
	r.notify()
}

// notify wakes the run's watchers. Callers hold e.mu.
func (r *runState) notify() {
	for ch := range r.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// listChanged wakes the run-list watchers. Callers hold e.mu.
func (e *Explorer) listChanged() {
	e.lrev++
	for ch := range e.lsubs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// List is the run list.
type List struct {
	Runs  []Summary `json:"runs"`
	Error string    `json:"error,omitempty"`
	Now   int64     `json:"now"` // the run's clock, unix seconds
}

func (e *Explorer) list() List {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := List{Runs: []Summary{}, Error: e.listErr, Now: e.cfg.now().Unix()}
	for _, id := range e.listed {
		if r := e.runs[id]; r != nil {
			l.Runs = append(l.Runs, r.h.summary())
		}
	}
	return l
}

// Update is what the page gets about one run: the view, and the points
// changed since the last update (all of them in the first, Reset).
type Update struct {
	View   View    `json:"view"`
	Points []Point `json:"points"`
	Reset  bool    `json:"reset"`
	Now    int64   `json:"now"` // the run's clock, unix seconds
	Listed bool    `json:"listed"`
	Error  string  `json:"error,omitempty"` // the backend's, if it cannot be reached
}

// update returns the run's update since rev and the rev it is at; ok is
// false for a run the explorer does not know.
func (e *Explorer) update(id string, rev uint64) (Update, uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.runs[id]
	if r == nil || (!slices.Contains(e.listed, id) && !r.h.seen) {
		return Update{}, 0, false
	}
	v := r.h.view
	v.TotalEpochs = e.cfg.epochLimit
	u := Update{View: v, Points: r.h.since(rev), Reset: rev == 0, Now: e.cfg.now().Unix(),
		Listed: slices.Contains(e.listed, id), Error: e.listErr}
	u.View.Clients = slices.Clone(u.View.Clients)
	u.View.Rounds = slices.Clone(u.View.Rounds)
	u.View.Checkpoints = slices.Clone(u.View.Checkpoints)
	if u.View.Clients == nil {
		u.View.Clients = []Client{}
	}
	if u.View.Rounds == nil {
		u.View.Rounds = []Round{}
	}
	return u, r.h.rev, true
}

// watchRun registers a watcher of one run; false if the run is unknown.
func (e *Explorer) watchRun(id string) (chan struct{}, func(), bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.runs[id]
	if r == nil {
		return nil, nil, false
	}
	ch := make(chan struct{}, 1)
	r.subs[ch] = struct{}{}
	return ch, func() {
		e.mu.Lock()
		delete(r.subs, ch)
		e.mu.Unlock()
	}, true
}

func (e *Explorer) watchList() (chan struct{}, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch := make(chan struct{}, 1)
	e.lsubs[ch] = struct{}{}
	return ch, func() {
		e.mu.Lock()
		delete(e.lsubs, ch)
		e.mu.Unlock()
	}
}
