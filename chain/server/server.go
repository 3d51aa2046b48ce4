package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/connlimit"
	"github.com/psyche-go/psyche/internal/httpserve"
)

// run is one coordinator, its incarnation and its replay table. Its mutex
// serializes instructions and ticks, as a chain serializes transactions on
// an account.
type run struct {
	mu          sync.Mutex
	incarnation uint64
	creator     coordinator.Pubkey // the main authority, fixed at init: counted against its quota
	state       *coordinator.Coordinator
	replay      replayTable
	subs        map[*subscriber]struct{}
	gone        bool // freed: requests that waited for mu find no run
}

func newRun(st *stored) *run {
	if st.replay.seqs == nil {
		st.replay.seqs = map[coordinator.Pubkey]uint64{}
	}
	return &run{incarnation: st.incarnation, creator: st.state.MainAuthority, state: st.state, replay: st.replay,
		subs: map[*subscriber]struct{}{}}
}

// subscriber is one event stream: ch holds the newest event it has not
// written yet.
type subscriber struct {
	ch   chan *event
	addr string
}

// notify hands the current account to every subscriber, replacing the
// pending snapshot of one that has not written the last one yet (only the
// newest matters). The event is encoded once for all of them, so a change
// costs the same whatever the number of streams. Callers hold mu.
func (r *run) notify() {
	if len(r.subs) == 0 {
		return
	}
	ev := newEvent(r.state.MarshalAccount())
	for sub := range r.subs {
		select {
		case sub.ch <- ev:
		default:
			select {
			case <-sub.ch:
			default:
			}
			select {
			case sub.ch <- ev:
			default:
			}
		}
	}
}

type config struct {
	p2p      P2P
	log      *slog.Logger
	interval time.Duration
	manual   bool // Serve never ticks: the owner calls Tick
	now      func() time.Time
	seed     func(*coordinator.Coordinator) uint64 // a run's state -> the seed its next instruction may start a round with
	metrics  *Metrics

	window     time.Duration                   // requests are valid this long either side of the wall clock
	anyCreator bool                            // any key may create runs (creators ignored)
	creators   map[coordinator.Pubkey]struct{} // who may create runs otherwise
	quota      int                             // live runs per main authority

	maxSubs, maxSubsPerAddr int
	slowWrite               time.Duration // an event write that takes longer drops the stream

	readTimeout, writeTimeout, idleTimeout time.Duration
	maxConns, maxConnsPerAddr              int             // WithMaxConns, WithMaxConnsPerAddr
	onFree                                 func(id string) // WithOnFree (nil: nothing to do)

	routes []func(*http.ServeMux) // more endpoints (WithRoutes)
	page   http.Handler           // WithPage (explorer.go)
	data   *dataServer            // WithData (data.go)
}

// Option configures a Server.
type Option func(*config) error

// Defaults (see the options that change them).
const (
	DefaultRequestWindow      = 5 * time.Minute
	DefaultCreatorQuota       = 16
	DefaultMaxSubscribers     = 1024
	DefaultMaxSubscribersAddr = 64
	DefaultSlowSubscriber     = 10 * time.Second
	DefaultReadTimeout        = 30 * time.Second
	DefaultWriteTimeout       = 30 * time.Second
	DefaultIdleTimeout        = 2 * time.Minute
	DefaultMaxConns           = 4096
	DefaultMaxConnsPerAddr    = 256
)

// WithCreators lets only these keys create runs (none: nobody may). Without
// it or WithAnyCreator, any key may: the library's default suits an
// embedded server that only its own process reaches (psyche localnet); the
// psyche server command defaults to its operator's key.
func WithCreators(keys ...coordinator.Pubkey) Option {
	return func(c *config) error {
		c.anyCreator = false
		c.creators = make(map[coordinator.Pubkey]struct{}, len(keys))
		for _, k := range keys {
			c.creators[k] = struct{}{}
		}
		return nil
	}
}

// WithAnyCreator lets any key create runs (each still within its quota).
func WithAnyCreator() Option {
	return func(c *config) error { c.anyCreator, c.creators = true, nil; return nil }
}

// WithCreatorQuota sets how many live runs one main authority may hold
// (default DefaultCreatorQuota). Freeing a run gives its place back.
func WithCreatorQuota(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("server: creator quota %d must be at least 1", n)
		}
		c.quota = n
		return nil
	}
}

// WithRequestWindow sets how far from the server's wall clock a request's
// sequence (nanoseconds) may be (default DefaultRequestWindow): a request
// older than that is refused as stale, so a captured one that was refused
// cannot be replayed later.
func WithRequestWindow(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("server: request window %v must be positive", d)
		}
		c.window = d
		return nil
	}
}

// WithSubscriberLimits caps the open event streams, in all and per remote
// address group (an IPv4 address, an IPv6 /64: internal/connlimit.Group;
// defaults DefaultMaxSubscribers, DefaultMaxSubscribersAddr). A stream over
// its group's cap is refused with 429 (and Retry-After); one over the total
// takes the place of the oldest stream of the group that holds the most, if
// that group holds at least two more than its own, and is refused
// otherwise. A client refused a stream polls the run instead (Client).
func WithSubscriberLimits(total, perAddr int) Option {
	return func(c *config) error {
		if total < 1 || perAddr < 1 {
			return fmt.Errorf("server: subscriber limits %d, %d must be at least 1", total, perAddr)
		}
		c.maxSubs, c.maxSubsPerAddr = total, perAddr
		return nil
	}
}

// WithSlowSubscriber sets how long writing one event to a stream may take
// before the stream is dropped (default DefaultSlowSubscriber): a client
// that stops reading fills its socket buffers and is then cut off instead
// of holding memory and a goroutine forever.
func WithSlowSubscriber(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("server: slow subscriber timeout %v must be positive", d)
		}
		c.slowWrite = d
		return nil
	}
}

// WithHTTPTimeouts sets the HTTP server's read, write and idle timeouts
// (defaults DefaultReadTimeout, DefaultWriteTimeout, DefaultIdleTimeout).
// Event streams are exempt from the read and write timeouts: they live as
// long as their client reads, each event bounded by WithSlowSubscriber.
func WithHTTPTimeouts(read, write, idle time.Duration) Option {
	return func(c *config) error {
		if read <= 0 || write <= 0 || idle <= 0 {
			return fmt.Errorf("server: HTTP timeouts %v, %v, %v must be positive", read, write, idle)
		}
		c.readTimeout, c.writeTimeout, c.idleTimeout = read, write, idle
		return nil
	}
}

// WithMaxConns caps the HTTP connections open at once (default
// DefaultMaxConns), so strangers cannot hold a goroutine and buffers each
// without bound. Past it, a new connection takes the place of an idle one
// (or one that has not sent a whole request yet) of the address group that
// holds the most, if it holds at least two more than the newcomer's;
// otherwise the new one is closed at once (internal/httpserve).
func WithMaxConns(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("server: connection cap %d must be positive", n)
		}
		c.maxConns = n
		return nil
	}
}

// WithMaxConnsPerAddr caps the HTTP connections of one address group (an
// IPv4 address, an IPv6 /64) (default DefaultMaxConnsPerAddr: 64 trainers
// behind one NAT, each with its stream and a few keep-alive connections).
// Past it, a new connection from the group takes the place of the group's
// connection idle the longest, or is closed when none is idle.
func WithMaxConnsPerAddr(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("server: per-address connection cap %d must be positive", n)
		}
		c.maxConnsPerAddr = n
		return nil
	}
}

// WithOnFree sets a function called with a run's id once the run is freed
// (after its tombstone is written): where other services keep state beside
// the run (the federated service), this is when it goes.
func WithOnFree(f func(id string)) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("server: WithOnFree: nil function")
		}
		c.onFree = f
		return nil
	}
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("server: nil logger")
		}
		c.log = l
		return nil
	}
}

// WithTickInterval sets the longest Serve waits between ticks (default 1s).
// Serve also ticks when a run's next transition falls due (the second its
// timeout ends, coordinator.DueAt) and after every instruction that changed a
// run, so a transition never waits for the interval.
func WithTickInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("server: tick interval %v must be positive", d)
		}
		c.interval = d
		return nil
	}
}

// WithManualTicks makes Serve never tick by itself: the owner calls Tick
// (a virtual clock that ticks when it moves, a test that must see exactly
// the acknowledged state).
func WithManualTicks() Option {
	return func(c *config) error { c.manual = true; return nil }
}

// WithRoutes adds HTTP routes to the server's API (federated runs'
// service, federated/fedserver, mounts itself this way).
func WithRoutes(add func(*http.ServeMux)) Option {
	return func(c *config) error { c.routes = append(c.routes, add); return nil }
}

// WithClock replaces the wall clock (tests).
func WithClock(now func() time.Time) Option {
	return func(c *config) error { c.now = now; return nil }
}

// WithSeeds replaces the random round seeds (tests).
func WithSeeds(seed func() uint64) Option {
	return func(c *config) error { c.seed = func(*coordinator.Coordinator) uint64 { return seed() }; return nil }
}

// WithStateSeeds draws each instruction's round seed from the run's state
// it applies to. A seed that is a function of the state (say, of its epoch,
// step and phase) makes a run reproducible: the round that an instruction
// starts gets the same seed whichever instruction happens to start it, and
// however many came before (localnet --virtual-time). Predictable seeds let
// trainers know their batches early, so this is for runs that trust them.
func WithStateSeeds(seed func(s *coordinator.Coordinator) uint64) Option {
	return func(c *config) error { c.seed = seed; return nil }
}

func randomSeed(*coordinator.Coordinator) uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return binary.LittleEndian.Uint64(b[:])
}

// P2P is the libp2p host a server runs beside its runs (p2p/libp2p's
// Bootstrap): trainers bootstrap their run's DHT from it and, if it relays,
// reach each other through it. The server publishes its addresses and tells
// it which runs exist and who their members are.
type P2P interface {
	Addrs() []string
	Relay() bool
	// SetRuns is called with every run and the p2p keys of its clients and
	// joiners whenever they change.
	SetRuns(runs map[string][]coordinator.Pubkey)
}

// WithP2P runs p beside the runs (see P2P).
func WithP2P(p P2P) Option {
	return func(c *config) error { c.p2p = p; return nil }
}

// Server is the embedded coordinator backend.
type Server struct {
	dir string
	cfg config
	id  [32]byte // the server's identity, which every request is signed for

	// mu guards the maps below. Lock order: a run's mutex first, then mu
	// (freeRun holds the run while it removes it); never the reverse.
	mu          sync.Mutex
	runs        map[string]*run
	freed       map[string]uint64 // incarnation of each freed run id (its tombstone)
	quarantined map[string]error  // runs whose file cannot be trusted: served to nobody, never overwritten
	owned       map[coordinator.Pubkey]int

	subs     *connlimit.Pool // strangers' event streams, by address group
	etagSeed maphash.Seed    // GET /v1/runs/{id}'s ETag: a hash of the account

	pmu     sync.Mutex
	members map[string][]coordinator.Pubkey // by run: what cfg.p2p was last told

	// changed wakes Serve's ticker: an instruction changed a run, which may
	// have made a transition due sooner.
	changed chan struct{}
}

// setMembers records a run's members (nil state: the run is gone) and
// tells the p2p host if they changed. Callers may hold the run's mutex.
func (s *Server) setMembers(id string, st *coordinator.Coordinator) {
	if s.cfg.p2p == nil {
		return
	}
	s.pmu.Lock()
	defer s.pmu.Unlock()
	old, had := s.members[id]
	if st == nil {
		if !had {
			return
		}
		delete(s.members, id)
	} else {
		keys := make([]coordinator.Pubkey, 0, int(st.Epoch.ClientsLen)+int(st.PendingLen))
		for _, c := range st.Epoch.Clients[:st.Epoch.ClientsLen] {
			keys = append(keys, c.ID.P2P)
		}
		for _, p := range st.Pending[:st.PendingLen] {
			keys = append(keys, p.P2P)
		}
		if had && slices.Equal(old, keys) {
			return
		}
		s.members[id] = keys
	}
	all := make(map[string][]coordinator.Pubkey, len(s.members))
	for k, v := range s.members {
		all[k] = v
	}
	s.cfg.p2p.SetRuns(all)
}

// New opens (or creates) a server whose state lives in dir, loading every run
// persisted there. A run whose file cannot be read or trusted is quarantined
// (logged, and refused with ErrQuarantined) while the others are served.
func New(dir string, opts ...Option) (*Server, error) {
	cfg := config{log: slog.New(slog.DiscardHandler), interval: time.Second, now: time.Now, seed: randomSeed,
		window: DefaultRequestWindow, anyCreator: true, quota: DefaultCreatorQuota,
		maxSubs: DefaultMaxSubscribers, maxSubsPerAddr: DefaultMaxSubscribersAddr, slowWrite: DefaultSlowSubscriber,
		readTimeout: DefaultReadTimeout, writeTimeout: DefaultWriteTimeout, idleTimeout: DefaultIdleTimeout,
		maxConns: DefaultMaxConns, maxConnsPerAddr: DefaultMaxConnsPerAddr}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.metrics == nil {
		cfg.metrics = NewMetrics(nil)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if err := openData(cfg.data, dir); err != nil {
		return nil, err
	}
	id, fresh, err := loadID(dir)
	if err != nil {
		return nil, err
	}
	if fresh {
		cfg.log.Info("new server identity", "server", hex.EncodeToString(id[:]), "dir", dir)
	}
	l, err := loadRuns(dir)
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, cfg: cfg, id: id, runs: map[string]*run{}, freed: map[string]uint64{},
		quarantined: l.quarantined, owned: map[coordinator.Pubkey]int{}, subs: connlimit.NewPool(cfg.maxSubs, cfg.maxSubsPerAddr, false),
		etagSeed: maphash.MakeSeed(),
		members:  map[string][]coordinator.Pubkey{}, changed: make(chan struct{}, 1)}
	for rid, st := range l.runs {
		if st.freed {
			s.freed[rid] = st.incarnation
			continue
		}
		r := newRun(st)
		s.runs[rid] = r
		s.owned[r.creator]++
		cfg.log.Info("loaded run", "run", rid, "incarnation", st.incarnation, "state", st.state.RunState.String(),
			"epoch", st.state.Progress.Epoch, "step", st.state.Progress.Step)
	}
	for rid, err := range s.quarantined {
		cfg.log.Error("run quarantined: its file is left as it is and the run is not served; restore the file or remove it",
			"run", rid, "err", err)
	}
	cfg.metrics.Runs.Set(float64(len(s.runs)))
	cfg.metrics.Quarantined.Set(float64(len(s.quarantined)))
	for rid, r := range s.runs {
		s.setMembers(rid, r.state)
	}
	return s, nil
}

func (s *Server) unixNow() uint64 { return uint64(s.cfg.now().Unix()) }

// ID is the server's identity, which requests are signed for.
func (s *Server) ID() [32]byte { return s.id }

// checkRunID refuses what cannot be a run id here: what ParseRunID refuses,
// and ids starting with "." (the server's temporary files start with ".",
// and a run stored as a hidden file would be skipped when loading, then
// free to be created again by another key).
func checkRunID(id string) error {
	if _, err := coordinator.ParseRunID(id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRunID, err)
	}
	if strings.HasPrefix(id, ".") {
		return fmt.Errorf("%w: %q starts with \".\" (refused by the server backend, whose temporary files start with \".\")", ErrInvalidRunID, id)
	}
	return nil
}

// refuseRunID is the refusal for an error of checkRunID.
func refuseRunID(err error) (*Failure, int) {
	return refuse("InvalidRunID", strings.TrimPrefix(err.Error(), ErrInvalidRunID.Error()+": "))
}

// Quarantined lists the quarantined runs and why.
func (s *Server) Quarantined() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.quarantined))
	for id, err := range s.quarantined {
		out[id] = err.Error()
	}
	return out
}

// Runs lists the run ids.
func (s *Server) Runs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.runs))
	for id := range s.runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (s *Server) run(id string) *run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[id]
}

// Account returns the encoded account of a run.
func (s *Server) Account(id string) ([]byte, bool) {
	r := s.run(id)
	if r == nil {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.MarshalAccount(), true
}

// Tick advances every run once; each change is persisted before it is
// published.
func (s *Server) Tick() {
	now := s.unixNow()
	for _, id := range s.Runs() {
		r := s.run(id)
		if r == nil {
			continue
		}
		r.mu.Lock()
		// A halted run (paused, finished, not configured) has nothing due:
		// it costs no copy of its state, so idle runs cost little.
		if r.gone || r.state.RunState.Halted() {
			r.mu.Unlock()
			continue
		}
		next := *r.state
		changed, err := next.Tick(now, s.cfg.seed(&next))
		if err == nil && changed {
			// A tick can end an epoch: signers it forgets leave the table.
			replay := r.replay.record(&next, coordinator.Pubkey{}, 0)
			if err := saveRun(s.dir, id, &stored{incarnation: r.incarnation, state: &next, replay: replay}); err != nil {
				s.cfg.log.Error("persisting a tick failed; the tick is dropped", "run", id, "err", err)
			} else {
				from := r.state.RunState
				*r.state, r.replay = next, replay
				r.notify()
				s.setMembers(id, r.state)
				s.cfg.metrics.Transitions.Inc()
				if from != next.RunState {
					// Rounds change state twice a step: DEBUG; the rest
					// (an epoch's start and end, a pause, the finish) INFO.
					level := slog.LevelInfo
					if roundState(from) && roundState(next.RunState) {
						level = slog.LevelDebug
					}
					s.cfg.log.Log(context.Background(), level, "run state", "run", id, "from", from.String(), "to", next.RunState.String(),
						"epoch", next.Progress.Epoch, "step", next.Progress.Step)
				}
			}
		}
		r.mu.Unlock()
	}
}

// roundState says whether a run's steps advance in state st.
func roundState(st coordinator.RunState) bool {
	return st == coordinator.RoundTrain || st == coordinator.RoundWitness
}

// Result is the reply to a request.
type Result struct {
	Changed     bool   `json:"changed"`
	From        string `json:"from"`
	To          string `json:"to"`
	Nonce       uint64 `json:"nonce"`
	Incarnation uint64 `json:"incarnation"` // the run's (after init_coordinator: the new one)
}

// Failure is the reply to a rejected request.
type Failure struct {
	Code  uint32 `json:"code,omitempty"` // coordinator error code, if any
	Name  string `json:"name"`
	Error string `json:"error"`
}

// Execute verifies and applies one encoded request. It returns the HTTP
// status that goes with the outcome.
func (s *Server) Execute(body []byte) (*Result, *Failure, int) {
	ix, res, fail, status := s.execute(body)
	outcome := "ok"
	if fail != nil {
		outcome = fail.Name
	}
	s.cfg.metrics.Requests.WithLabelValues(ix, outcome).Inc()
	return res, fail, status
}

// execute is Execute; it also names the instruction ("?" when the request
// could not be read). Every check that can refuse a request comes before
// anything is written, and a refused request leaves no trace but a metric.
func (s *Server) execute(body []byte) (name string, _ *Result, _ *Failure, _ int) {
	name = "?"
	req, err := DecodeRequest(body)
	if err != nil {
		if errors.Is(err, ErrSignature) {
			f, st := refuse("BadSignature", strings.TrimPrefix(err.Error(), ErrSignature.Error()+": "))
			return name, nil, f, st
		}
		f, st := refuse("BadRequest", strings.TrimPrefix(err.Error(), ErrBadRequest.Error()+": "))
		return name, nil, f, st
	}
	ix, err := coordinator.DecodeInstruction(req.Data)
	if err != nil {
		return name, nil, failure(err), http.StatusBadRequest
	}
	name = ix.Name()
	if req.Server != s.id {
		f, st := refuse("Stale", fmt.Sprintf("signed for server %x, this is %x", req.Server[:8], s.id[:8]))
		return name, nil, f, st
	}
	id := coordinator.FixedString(req.RunID[:])
	if err := checkRunID(id); err != nil {
		f, st := refuseRunID(err)
		return name, nil, f, st
	}
	if packed, _ := coordinator.ParseRunID(id); packed != req.RunID {
		f, st := refuse("InvalidRunID", fmt.Sprintf("%q is followed by bytes other than zero padding", id))
		return name, nil, f, st
	}
	if f, st := s.checkWindow(req.Sequence); f != nil {
		return name, nil, f, st
	}
	ctx := coordinator.Context{Sender: req.Sender, CoSigner: req.CoSigner, Now: s.unixNow()}
	if init, ok := ix.(*coordinator.InitCoordinator); ok {
		out, fail, status := s.initRun(id, req, init, ctx)
		return name, out, fail, status
	}
	r, f, st := s.liveRun(id)
	if f != nil {
		return name, nil, f, st
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone {
		return name, nil, &Failure{Name: "RunNotFound", Error: fmt.Sprintf("server: no run %q", id)}, http.StatusNotFound
	}
	if req.Incarnation != r.incarnation {
		f, st := refuse("Stale", fmt.Sprintf("signed for incarnation %d of run %q, which is at %d", req.Incarnation, id, r.incarnation))
		return name, nil, f, st
	}
	if req.Sequence <= r.replay.last(req.Sender) {
		f, st := refuse("Replay", "")
		return name, nil, f, st
	}
	next := *r.state
	ctx.Seed = s.cfg.seed(&next)
	res, applyErr := next.Apply(ctx, ix)
	if applyErr != nil {
		return name, nil, failure(applyErr), http.StatusConflict
	}
	if _, free := ix.(*coordinator.FreeCoordinator); free {
		out, fail, status := s.freeRun(id, r, &res)
		return name, out, fail, status
	}
	out := &Result{Changed: res.Changed, From: res.From.String(), To: res.To.String(), Nonce: next.Nonce, Incarnation: r.incarnation}
	if !res.Changed {
		// Nothing to persist, so nothing is stored: replaying a request
		// that changed nothing (a tick with nothing due, a join that was
		// already there) is no more than its signer may do anyway.
		return name, out, nil, http.StatusOK
	}
	replay := r.replay.record(&next, req.Sender, req.Sequence)
	if err := saveRun(s.dir, id, &stored{incarnation: r.incarnation, state: &next, replay: replay}); err != nil {
		s.cfg.log.Error("persisting failed; the instruction is rejected", "run", id, "err", err)
		f, st := refuse("Storage", err.Error())
		return name, nil, f, st
	}
	*r.state, r.replay = next, replay
	r.notify()
	s.setMembers(id, r.state)
	s.wake()
	s.cfg.log.Debug("instruction", "run", id, "ix", ix.Name(), "from", res.From.String(), "to", res.To.String())
	return name, out, nil, http.StatusOK
}

// checkWindow refuses a sequence further than the request window from the
// wall clock (nanoseconds). The wall clock, not the run clock (WithClock):
// expiry is about the network, and a run in virtual time may be hours
// ahead.
func (s *Server) checkWindow(seq uint64) (*Failure, int) {
	now := time.Now().UnixNano()
	w := s.cfg.window.Nanoseconds()
	if d := int64(seq - uint64(now)); d > w || d < -w {
		return refuse("Stale", fmt.Sprintf("sequence %d is %v from the server's clock, more than the window of %v (fetch the binding again)",
			seq, time.Duration(d).Round(time.Millisecond), s.cfg.window))
	}
	return nil, 0
}

// liveRun finds a run, or says why there is none.
func (s *Server) liveRun(id string) (*run, *Failure, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err, bad := s.quarantined[id]; bad {
		f, st := refuse("Quarantined", err.Error())
		return nil, f, st
	}
	if r := s.runs[id]; r != nil {
		return r, nil, 0
	}
	return nil, &Failure{Name: "RunNotFound", Error: fmt.Sprintf("server: no run %q", id)}, http.StatusNotFound
}

func (s *Server) initRun(id string, req *Request, ix *coordinator.InitCoordinator, ctx coordinator.Context) (*Result, *Failure, int) {
	if ix.RunID != req.RunID {
		f, st := refuse("BadRequest", "init_coordinator names another run than the request")
		return nil, f, st
	}
	if req.Sender != ix.MainAuthority {
		f, st := refuse("NotMainAuthority", fmt.Sprintf("signed by %s, names %s", req.Sender, ix.MainAuthority))
		return nil, f, st
	}
	if _, ok := s.cfg.creators[req.Sender]; !ok && !s.cfg.anyCreator {
		f, st := refuse("NotCreator", req.Sender.String())
		return nil, f, st
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err, bad := s.quarantined[id]; bad {
		f, st := refuse("Quarantined", err.Error())
		return nil, f, st
	}
	if _, exists := s.runs[id]; exists {
		return nil, failure(coordinator.ErrAlreadyInitialized), http.StatusConflict
	}
	if want := s.freed[id] + 1; req.Incarnation != want {
		f, st := refuse("Stale", fmt.Sprintf("init_coordinator signed for incarnation %d of run %q, the next is %d", req.Incarnation, id, want))
		return nil, f, st
	}
	if s.owned[req.Sender] >= s.cfg.quota {
		f, st := refuse("CreatorQuota", fmt.Sprintf("%s holds %d runs", req.Sender, s.owned[req.Sender]))
		return nil, f, st
	}
	state := new(coordinator.Coordinator)
	res, err := state.Apply(ctx, ix)
	if err != nil {
		return nil, failure(err), http.StatusConflict
	}
	st := &stored{incarnation: req.Incarnation, state: state}
	st.replay = st.replay.record(state, req.Sender, req.Sequence)
	if err := saveRun(s.dir, id, st); err != nil {
		f, status := refuse("Storage", err.Error())
		return nil, f, status
	}
	r := newRun(st)
	s.runs[id] = r
	delete(s.freed, id)
	s.owned[r.creator]++
	s.setMembers(id, state)
	s.cfg.metrics.Runs.Set(float64(len(s.runs)))
	s.cfg.log.Info("run created", "run", id, "incarnation", st.incarnation, "creator", req.Sender.String())
	return &Result{Changed: true, From: res.From.String(), To: res.To.String(), Nonce: state.Nonce, Incarnation: st.incarnation}, nil, http.StatusOK
}

// freeRun deletes a run (the caller holds r.mu): its file becomes a
// tombstone that keeps its incarnation, so the id's next init is signed for
// the next one and nothing signed for this one applies again.
func (s *Server) freeRun(id string, r *run, res *coordinator.Result) (*Result, *Failure, int) {
	if err := saveRun(s.dir, id, &stored{incarnation: r.incarnation, freed: true}); err != nil {
		f, st := refuse("Storage", err.Error())
		return nil, f, st
	}
	r.gone = true
	s.mu.Lock()
	delete(s.runs, id)
	s.freed[id] = r.incarnation
	if s.owned[r.creator]--; s.owned[r.creator] <= 0 {
		delete(s.owned, r.creator)
	}
	s.cfg.metrics.Runs.Set(float64(len(s.runs)))
	s.mu.Unlock()
	s.setMembers(id, nil)
	for sub := range r.subs {
		close(sub.ch)
		delete(r.subs, sub)
	}
	s.cfg.log.Info("run freed", "run", id, "incarnation", r.incarnation)
	if s.cfg.onFree != nil {
		s.cfg.onFree(id)
	}
	return &Result{Changed: true, From: res.From.String(), To: res.To.String(), Nonce: r.state.Nonce, Incarnation: r.incarnation}, nil, http.StatusOK
}

func failure(err error) *Failure {
	var e *coordinator.Error
	if errors.As(err, &e) {
		return &Failure{Code: e.Code, Name: e.Name, Error: err.Error()}
	}
	return &Failure{Name: "Error", Error: err.Error()}
}

// Binding is what a request for run id must be signed for (see Binding).
func (s *Server) Binding(id string) (Binding, *Failure, int) {
	if err := checkRunID(id); err != nil {
		f, st := refuseRunID(err)
		return Binding{}, f, st
	}
	b := Binding{Server: s.id}
	s.mu.Lock()
	if err, bad := s.quarantined[id]; bad {
		s.mu.Unlock()
		f, st := refuse("Quarantined", err.Error())
		return Binding{}, f, st
	}
	r := s.runs[id]
	b.Incarnation = s.freed[id] + 1
	s.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		if !r.gone {
			b.Incarnation, b.Floor = r.incarnation, r.replay.floor
		}
		r.mu.Unlock()
	}
	b.Now = uint64(time.Now().UnixNano())
	return b, nil, http.StatusOK
}

// subscribe registers a stream from addr (a remote address, or inProcess)
// that receives the run's account on every change, starting with the
// current one, within the subscriber limits. shed, if not nil, is called
// when the stream is closed to make room for a lighter address group's
// (WithSubscriberLimits): the caller must then end it.
func (s *Server) subscribe(id, addr string, shed func()) (*subscriber, func(), *Failure, int) {
	r, f, st := s.liveRun(id)
	if f != nil {
		return nil, nil, f, st
	}
	// The caps are for strangers' streams. The server's own page (the
	// built-in explorer) follows every run in process, one stream a run: it
	// is bounded by the runs, and counting it would let anonymous streams
	// (or a hundred runs under one "address") blind the page.
	var slot *connlimit.Slot
	if addr != inProcess {
		group := connlimit.GroupOf(addr)
		if slot = s.subs.Acquire(group, true, func() {
			s.cfg.metrics.ShedSubscribers.Inc()
			s.cfg.log.Debug("closing an event stream for a lighter address's", "run", id, "addr", addr)
			if shed != nil {
				shed()
			}
		}); slot == nil {
			total, held := s.subs.Len(group)
			detail := fmt.Sprintf("%s holds %d streams", group, held)
			if held < s.cfg.maxSubsPerAddr {
				detail = fmt.Sprintf("the server holds %d streams", total)
			}
			f, st := refuse("TooManySubscribers", detail)
			return nil, nil, f, st
		}
	}
	sub := &subscriber{ch: make(chan *event, 1), addr: addr}
	r.mu.Lock()
	if r.gone {
		close(sub.ch)
	} else {
		r.subs[sub] = struct{}{}
		sub.ch <- newEvent(r.state.MarshalAccount())
	}
	r.mu.Unlock()
	s.cfg.metrics.Subscribers.Inc()
	var once sync.Once
	return sub, func() {
		once.Do(func() {
			s.cfg.metrics.Subscribers.Dec()
			r.mu.Lock()
			delete(r.subs, sub)
			r.mu.Unlock()
			if slot != nil {
				slot.Release()
			}
		})
	}, nil, 0
}

// streamRetryAfter is what a refused stream's Retry-After says (seconds):
// the client polls meanwhile (Client).
const streamRetryAfter = 10

const maxBody = 1 << 16

// Handler serves the HTTP API:
//
//	POST /v1/instructions          a signed request (see wire.go) → Result or Failure (JSON)
//	GET  /v1/runs                  run ids (JSON)
//	GET  /v1/runs/{id}             the account bytes (with an ETag: If-None-Match is answered 304 while it has not changed)
//	GET  /v1/runs/{id}/binding     what requests for the run are signed for (JSON BindingInfo)
//	GET  /v1/runs/{id}/events      server-sent events, one base64 account per change (?deltas=1: then what changed; events.go); 429 with Retry-After past the stream caps
//	GET  /v1/p2p                   the p2p host's addresses and whether it relays (JSON P2PInfo; 404 without one)
//	GET  /healthz                  "ok"
//	GET  /data/{path...}           a file of the data directory, WithData (data.go): ranges, HEAD; 429 with Retry-After past the read caps
//	GET  /                         the run explorer's page, WithPage (read-only)
//
// Every refusal is a JSON Failure with an HTTP status (errors.go).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/instructions", func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBody))
		if err != nil {
			writeJSON(w, http.StatusRequestEntityTooLarge, &Failure{Name: "BadRequest", Error: err.Error()})
			return
		}
		res, fail, status := s.Execute(body)
		if fail != nil {
			writeJSON(w, status, fail)
			return
		}
		writeJSON(w, status, res)
	})
	mux.HandleFunc("GET /v1/runs", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.Runs()) })
	mux.HandleFunc("GET /v1/runs/{id}", func(w http.ResponseWriter, req *http.Request) {
		id := req.PathValue("id")
		if _, f, st := s.liveRun(id); f != nil {
			writeJSON(w, st, f)
			return
		}
		acct, ok := s.Account(id)
		if !ok {
			writeJSON(w, http.StatusNotFound, &Failure{Name: "RunNotFound", Error: "server: no such run"})
			return
		}
		// A client polling the run (its stream refused: Client) asks
		// whether it changed, and is told so in a few bytes.
		tag := fmt.Sprintf(`"%016x"`, maphash.Bytes(s.etagSeed, acct))
		w.Header().Set("ETag", tag)
		w.Header().Set("Cache-Control", "no-cache")
		if req.Header.Get("If-None-Match") == tag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(acct)
	})
	mux.HandleFunc("GET /v1/runs/{id}/binding", func(w http.ResponseWriter, req *http.Request) {
		b, f, st := s.Binding(req.PathValue("id"))
		if f != nil {
			writeJSON(w, st, f)
			return
		}
		writeJSON(w, http.StatusOK, BindingInfo{Server: hex.EncodeToString(b.Server[:]), Incarnation: b.Incarnation, Floor: b.Floor, Now: b.Now})
	})
	mux.HandleFunc("GET /v1/runs/{id}/events", s.serveEvents)
	mux.HandleFunc("GET /v1/p2p", func(w http.ResponseWriter, _ *http.Request) {
		if s.cfg.p2p == nil {
			writeJSON(w, http.StatusNotFound, &Failure{Name: "NoP2P", Error: "server: this server runs no p2p host"})
			return
		}
		writeJSON(w, http.StatusOK, P2PInfo{Addrs: s.cfg.p2p.Addrs(), Relay: s.cfg.p2p.Relay()})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	for _, add := range s.cfg.routes {
		add(mux)
	}
	if s.cfg.page != nil {
		mux.Handle("GET /", s.cfg.page)
	}
	if s.cfg.data != nil {
		// Before the mux, which would clean "/data/../x" into a redirect.
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if isDataPath(req) {
				s.serveData(w, req)
				return
			}
			mux.ServeHTTP(w, req)
		})
	}
	return mux
}

// serveEvents streams a run's snapshots until the client goes away, the run
// is freed, or one event takes longer than the slow-subscriber timeout to
// write (the client stopped reading): then the stream is dropped, so a
// client that never reads holds neither memory nor a goroutine for long.
func (s *Server) serveEvents(w http.ResponseWriter, req *http.Request) {
	addr := req.RemoteAddr
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	// A stream shed for a lighter address group's ends as if its client
	// had gone.
	ctx, end := context.WithCancel(req.Context())
	defer end()
	sub, cancel, f, st := s.subscribe(req.PathValue("id"), addr, end)
	if f != nil {
		if st == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", strconv.Itoa(streamRetryAfter))
		}
		writeJSON(w, st, f)
		return
	}
	defer cancel()
	rc := http.NewResponseController(w)
	// The server's write timeout would cut a stream that lives longer than
	// it: each write gets its own deadline instead. (The read timeout does
	// not matter here: net/http clears it before the read that notices the
	// client going away.) An error means the writer cannot set deadlines (a
	// test recorder): then the stream just has none.
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.slowWrite))
	w.WriteHeader(http.StatusOK)
	// A subscriber that takes deltas gets, after the first account, what
	// changed since the one this stream sent last (events.go).
	deltas := req.URL.Query().Get("deltas") == "1"
	var sent []byte
	for {
		select {
		case <-ctx.Done():
			return
		case ev, open := <-sub.ch:
			if !open {
				return
			}
			out := ev.full
			if deltas && sent != nil {
				if d := DeltaEvent(sent, ev.acct); d != nil {
					out = d
				}
			}
			sent = ev.acct
			s.cfg.metrics.EventBytes.Add(float64(len(out)))
			_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.slowWrite))
			_, err := w.Write(out)
			if err == nil {
				err = rc.Flush()
			}
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					s.cfg.metrics.SlowSubscribers.Inc()
					s.cfg.log.Debug("dropping a slow event stream", "run", req.PathValue("id"), "addr", sub.addr)
				}
				return
			}
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Serve runs the HTTP API on l and ticks every run on the configured
// interval until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	lim := httpserve.Limits{ReadHeader: min(10*time.Second, s.cfg.readTimeout), Read: s.cfg.readTimeout,
		Write: s.cfg.writeTimeout, Idle: s.cfg.idleTimeout, MaxConns: s.cfg.maxConns, MaxConnsPerAddr: s.cfg.maxConnsPerAddr}
	hs := lim.Server(s.Handler(), ctx)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(lim.Listener(l)) }()
	t := time.NewTimer(s.untilDue())
	defer t.Stop()
	// DEBUG: psyche server prints where it listens on its own.
	s.cfg.log.Debug("server listening", "addr", l.Addr().String(), "dir", s.dir, "server", hex.EncodeToString(s.id[:]))
	for {
		select {
		case <-ctx.Done():
			shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(shutdown)
			return nil
		case err := <-errc:
			return fmt.Errorf("server: %w", err)
		case <-t.C:
			s.Tick()
		case <-s.changed:
		}
		t.Reset(s.untilDue())
	}
}

// wake tells Serve that a run changed outside a tick.
func (s *Server) wake() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// minTickWait keeps a tick that is due but cannot be persisted from
// spinning.
const minTickWait = 5 * time.Millisecond

// untilDue is how long Serve sleeps before the next tick: until the first
// run's next transition falls due (its state's timeout ends at a whole
// second, coordinator.DueAt), at most the tick interval. Ticking sooner than
// the interval changes no timeout: it only stops a due transition waiting.
func (s *Server) untilDue() time.Duration {
	wait := s.cfg.interval
	if s.cfg.manual {
		return time.Duration(math.MaxInt64)
	}
	now := s.cfg.now()
	s.mu.Lock()
	runs := make([]*run, 0, len(s.runs))
	for _, r := range s.runs {
		runs = append(runs, r)
	}
	s.mu.Unlock()
	for _, r := range runs {
		r.mu.Lock()
		at, ok := r.state.DueAt(uint64(now.Unix()))
		r.mu.Unlock()
		if ok {
			wait = min(wait, time.Unix(int64(at), 0).Sub(now))
		}
	}
	return max(wait, minTickWait)
}

// Run listens on addr and serves until ctx ends.
func (s *Server) Run(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	return s.Serve(ctx, l)
}
