package server

import (
	"context"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/connlimit"
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
// tells the p2p host if they changed: the epoch's clients, its joiners,
// and its exited list (the epoch before's members and this epoch's
// removals), but for one the run ejected. A trainer that stopped and was dropped is on the exited list
// only, and restarted (with its key, so its p2p identity) it needs the
// relay before it can join again: admitting clients and joiners alone,
// the relay refused its reservation (PERMISSION_DENIED) for the rest of
// the epoch. Callers may hold the run's mutex.
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
		keys := make([]coordinator.Pubkey, 0, int(st.Epoch.ClientsLen)+int(st.PendingLen)+int(st.Epoch.ExitedLen))
		for _, c := range st.Epoch.Clients[:st.Epoch.ClientsLen] {
			keys = append(keys, c.ID.P2P)
		}
		for _, p := range st.Pending[:st.PendingLen] {
			keys = append(keys, p.P2P)
		}
		exited := st.Epoch.Exited[:st.Epoch.ExitedLen]
		for _, c := range exited {
			ejected := slices.ContainsFunc(exited, func(x coordinator.Client) bool { return x.ID.P2P == c.ID.P2P && x.State == coordinator.Ejected })
			if !ejected {
				keys = append(keys, c.ID.P2P)
			}
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

// Run listens on addr and serves until ctx ends.
func (s *Server) Run(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	return s.Serve(ctx, l)
}
