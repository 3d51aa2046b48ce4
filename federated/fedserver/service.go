package fedserver

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/internal/atomicfile"
)

// Accounts reads a run's coordinator account (chain/server's
// Server.Account).
type Accounts func(id string) ([]byte, bool)

type run struct {
	mu      sync.Mutex
	m       *federated.Machine
	changed chan struct{} // closed and replaced when the round or config changes
	sa      *saRound      // the secure aggregation round under way, if any
	misses  int           // secure aggregation rounds of this base that failed
	demo    *distro.DeMo  // DisTrO runs: decodes and expands the clients' frames
	sizes   []int

	// The state file and its join journal (joinlog.go).
	stateSum  [32]byte // the checksum ending the state file
	stateLen  int64    // its size
	joins     *os.File // the journal, open for appending (nil: none yet)
	joinsLen  int64    // its size
	foldJoins bool     // the journal holds records the next full write must take in before any more are appended
}

// Service is the federated API of one server.
type Service struct {
	dir      string
	accounts Accounts
	log      *slog.Logger
	metrics  *Metrics
	noise    func() [32]byte
	maxWait  time.Duration
	onRun    func(id string)

	mu   sync.Mutex
	runs map[string]*run
	// quarantined are the runs whose state file could not be read or
	// trusted at start: refused (503) and never overwritten, so that the
	// operator can restore or remove the file; the other runs are served.
	quarantined map[string]error
	inflight    int // bytes of request bodies being read (MaxInflight)
}

// Option configures a Service.
type Option func(*Service) error

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(s *Service) error { s.log = l; return nil }
}

// WithMetrics sets the metrics (default: unregistered).
func WithMetrics(m *Metrics) Option {
	return func(s *Service) error { s.metrics = m; return nil }
}

// WithNoiseSeeds replaces crypto/rand as the source of central DP's noise
// seeds (tests).
func WithNoiseSeeds(f func() [32]byte) Option {
	return func(s *Service) error { s.noise = f; return nil }
}

// WithOnRun tells f of every federated run the service holds: each loaded
// at start, and each a first config creates (psyche server builds the
// browser trainer's module on the first). f is called from the service's
// goroutine and must not block.
func WithOnRun(f func(id string)) Option {
	return func(s *Service) error { s.onRun = f; return nil }
}

func randomSeed() [32]byte {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return b
}

const fileExt = ".fed"

// New opens (or creates) the service whose state lives in dir, loading
// every federated run there; accounts reads the coordinators.
func New(dir string, accounts Accounts, opts ...Option) (*Service, error) {
	s := &Service{dir: dir, accounts: accounts, log: slog.New(slog.DiscardHandler), noise: randomSeed,
		maxWait: 20 * time.Second, onRun: func(string) {}, runs: map[string]*run{}, quarantined: map[string]error{}}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(nil)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("fedserver: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("fedserver: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, fileExt) || strings.HasPrefix(name, ".") {
			continue
		}
		id := strings.TrimSuffix(name, fileExt)
		st, fr, err := s.load(id)
		if err != nil {
			s.quarantined[id] = err
			s.log.Error("federated run quarantined: its file is left as it is and the run is not served; restore the file or remove it",
				"run", id, "file", filepath.Join(dir, name), "err", err)
			continue
		}
		s.runs[id] = fr
		s.observe(id, st)
		s.log.Info("loaded federated run", "run", id, "round", st.Round, "buffered", len(st.Buffer), "members", len(st.Members))
		s.onRun(id)
	}
	s.metrics.Quarantined.Set(float64(len(s.quarantined)))
	return s, nil
}

// load reads a run's state file and the joins journaled since it was
// written.
func (s *Service) load(id string) (*federated.State, *run, error) {
	path := s.path(id)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("fedserver: %w", err)
	}
	st, err := federated.DecodeState(b)
	if err != nil {
		return nil, nil, fmt.Errorf("fedserver: %s: %w", path, err)
	}
	fr := &run{changed: make(chan struct{}), stateSum: stateSum(b), stateLen: int64(len(b))}
	if fr.joinsLen, err = replayJoins(s.joinsPath(id), fr.stateSum, st); err != nil {
		return nil, nil, err
	}
	fr.foldJoins = fr.joinsLen > 0
	if fr.m, err = federated.Restore(st); err != nil {
		return nil, nil, fmt.Errorf("fedserver: %s: %w", path, err)
	}
	return st, fr, nil
}

// writeState replaces the run's state file with its machine's state, which
// takes in the journaled joins (callers hold fr.mu, or own fr).
func (s *Service) writeState(id string, fr *run) error {
	enc := federated.EncodeState(fr.m.State())
	if err := atomicfile.WriteFile(s.path(id), enc, 0o644); err != nil {
		return err
	}
	s.metrics.Written.WithLabelValues(id, "state").Add(float64(len(enc)))
	s.resetJoins(id, fr, enc)
	return nil
}

// params is the number of values of run id's federated model (0: the run
// is not federated, or its state is a freed run's).
func (s *Service) params(id string, acct *coordinator.Coordinator) int {
	fr := s.current(id, acct)
	if fr == nil {
		return 0
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return len(fr.m.State().Model)
}

// reserve takes n bytes of the in-flight budget, or reports that it is
// spent.
func (s *Service) reserve(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight+n > MaxInflight {
		return false
	}
	s.inflight += n
	return true
}

func (s *Service) release(n int) {
	s.mu.Lock()
	s.inflight -= n
	s.mu.Unlock()
}

// Quarantined lists the quarantined runs and why.
func (s *Service) Quarantined() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.quarantined))
	for id, err := range s.quarantined {
		out[id] = err.Error()
	}
	return out
}

// quarantine answers a request for a quarantined run (true), or says the
// run is not quarantined (false).
func (s *Service) quarantine(w http.ResponseWriter, id string) bool {
	s.mu.Lock()
	err, bad := s.quarantined[id]
	s.mu.Unlock()
	if bad {
		fail(w, http.StatusServiceUnavailable, "Quarantined", fmt.Errorf("fedserver: run %q is quarantined: its state file cannot be trusted (%v); restore or remove %s", id, err, s.path(id)))
	}
	return bad
}

// Forget drops a run's federated state and removes its file (not a
// quarantined one's, which is the operator's to restore or remove): the
// server calls it when the coordinator run is freed (server.WithOnFree).
func (s *Service) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs[id] == nil {
		return
	}
	fr := s.runs[id]
	delete(s.runs, id)
	fr.mu.Lock()
	if fr.joins != nil {
		fr.joins.Close()
		fr.joins = nil
	}
	fr.mu.Unlock()
	if err := os.Remove(s.joinsPath(id)); err != nil && !os.IsNotExist(err) {
		s.log.Error("removing the join journal of a freed run failed", "run", id, "err", err)
	}
	if err := os.Remove(s.path(id)); err != nil && !os.IsNotExist(err) {
		s.log.Error("removing the federated state of a freed run failed", "run", id, "err", err)
		return
	}
	s.log.Info("federated state of a freed run removed", "run", id)
}

func (s *Service) path(id string) string { return filepath.Join(s.dir, id+fileExt) }

func (s *Service) observe(id string, st *federated.State) {
	s.metrics.Round.WithLabelValues(id).Set(float64(st.Round))
	s.metrics.Buffered.WithLabelValues(id).Set(float64(len(st.Buffer)))
	if central, _, err := st.Privacy(); err == nil && central < 1e300 {
		s.metrics.Epsilon.WithLabelValues(id).Set(central)
	}
}

// Routes adds the API to mux (chain/server's WithRoutes).
func (s *Service) Routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/federated", s.handleRequest)
	mux.HandleFunc("GET /v1/runs/{id}/federated", s.handleInfo)
	mux.HandleFunc("GET /v1/runs/{id}/federated/model", s.handleModel)
	mux.HandleFunc("GET /v1/runs/{id}/federated/secagg", s.handleSecAgg)
}

func (s *Service) account(id string) (*coordinator.Coordinator, bool) {
	b, ok := s.accounts(id)
	if !ok {
		return nil, false
	}
	c, err := coordinator.DecodeAccount(b)
	return c, err == nil
}

func (s *Service) run(id string) *run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[id]
}

// current is the run's federated state if it belongs to the coordinator run
// acct (nil if acct is nil: no such run, or one the server does not serve).
// A state left by a run that was freed belongs to no live run and is not
// served; readers never remove it (the run may only be quarantined by the
// server): Forget does when the run is freed, and a new run's first config
// replaces it.
func (s *Service) current(id string, acct *coordinator.Coordinator) *run {
	if acct == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fr := s.runs[id]
	if fr == nil {
		return nil
	}
	fr.mu.Lock()
	owner := fr.m.State().Owner
	fr.mu.Unlock()
	if owner != acct.MainAuthority {
		return nil
	}
	return fr
}
