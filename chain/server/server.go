package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

// run is one coordinator and its replay table. Its mutex serializes
// instructions and ticks, as a chain serializes transactions on an account.
type run struct {
	mu    sync.Mutex
	state *coordinator.Coordinator
	seqs  map[coordinator.Pubkey]uint64
	subs  map[chan []byte]struct{} // each receives encoded accounts
}

func newRun(state *coordinator.Coordinator, seqs map[coordinator.Pubkey]uint64) *run {
	return &run{state: state, seqs: seqs, subs: map[chan []byte]struct{}{}}
}

// notify hands the current account to every subscriber, dropping the oldest
// pending snapshot of a slow one (only the newest matters). Callers hold mu.
func (r *run) notify() {
	acct := r.state.MarshalAccount()
	for ch := range r.subs {
		select {
		case ch <- acct:
		default:
			select {
			case <-ch:
			default:
			}
			select {
			case ch <- acct:
			default:
			}
		}
	}
}

type config struct {
	p2p      P2P
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time
	seed     func() uint64
	metrics  *Metrics
	page     http.Handler // WithPage (explorer.go)
}

// Option configures a Server.
type Option func(*config) error

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

// WithTickInterval sets how often Run ticks every run (default 1s).
func WithTickInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("server: tick interval %v must be positive", d)
		}
		c.interval = d
		return nil
	}
}

// WithClock replaces the wall clock (tests).
func WithClock(now func() time.Time) Option {
	return func(c *config) error { c.now = now; return nil }
}

// WithSeeds replaces the random round seeds (tests).
func WithSeeds(seed func() uint64) Option {
	return func(c *config) error { c.seed = seed; return nil }
}

func randomSeed() uint64 {
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
	dir  string
	cfg  config
	mu   sync.Mutex
	runs map[string]*run

	pmu     sync.Mutex
	members map[string][]coordinator.Pubkey // by run: what cfg.p2p was last told
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
// persisted there.
func New(dir string, opts ...Option) (*Server, error) {
	cfg := config{log: slog.New(slog.DiscardHandler), interval: time.Second, now: time.Now, seed: randomSeed}
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
	runs, err := loadRuns(dir)
	if err != nil {
		return nil, err
	}
	for id, r := range runs {
		cfg.log.Info("loaded run", "run", id, "state", r.state.RunState.String(), "epoch", r.state.Progress.Epoch, "step", r.state.Progress.Step)
	}
	cfg.metrics.Runs.Set(float64(len(runs)))
	s := &Server{dir: dir, cfg: cfg, runs: runs, members: map[string][]coordinator.Pubkey{}}
	for id, r := range runs {
		s.setMembers(id, r.state)
	}
	return s, nil
}

func (s *Server) unixNow() uint64 { return uint64(s.cfg.now().Unix()) }

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
	s.mu.Lock()
	ids := make([]string, 0, len(s.runs))
	for id := range s.runs {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		r := s.run(id)
		if r == nil {
			continue
		}
		r.mu.Lock()
		next := *r.state
		changed, err := next.Tick(now, s.cfg.seed())
		if err == nil && changed {
			if err := saveRun(s.dir, id, &next, r.seqs); err != nil {
				s.cfg.log.Error("persisting a tick failed; the tick is dropped", "run", id, "err", err)
			} else {
				from := r.state.RunState
				*r.state = next
				r.notify()
				s.setMembers(id, r.state)
				s.cfg.metrics.Transitions.Inc()
				if from != next.RunState {
					s.cfg.log.Info("run state", "run", id, "from", from.String(), "to", next.RunState.String(),
						"epoch", next.Progress.Epoch, "step", next.Progress.Step)
				}
			}
		}
		r.mu.Unlock()
	}
}

// Result is the reply to a request.
type Result struct {
	Changed bool   `json:"changed"`
	From    string `json:"from"`
	To      string `json:"to"`
	Nonce   uint64 `json:"nonce"`
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
// could not be read).
func (s *Server) execute(body []byte) (name string, _ *Result, _ *Failure, _ int) {
	name = "?"
	req, err := DecodeRequest(body)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, ErrSignature) {
			status = http.StatusUnauthorized
		}
		return name, nil, &Failure{Name: "BadRequest", Error: err.Error()}, status
	}
	ix, err := coordinator.DecodeInstruction(req.Data)
	if err != nil {
		return name, nil, failure(err), http.StatusBadRequest
	}
	name = ix.Name()
	id := coordinator.FixedString(req.RunID[:])
	ctx := coordinator.Context{Sender: req.Sender, CoSigner: req.CoSigner, Now: s.unixNow(), Seed: s.cfg.seed()}
	if init, ok := ix.(*coordinator.InitCoordinator); ok {
		out, fail, status := s.initRun(id, req, init, ctx)
		return name, out, fail, status
	}
	r := s.run(id)
	if r == nil {
		return name, nil, &Failure{Name: "RunNotFound", Error: fmt.Sprintf("server: no run %q", id)}, http.StatusNotFound
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if req.Sequence <= r.seqs[req.Sender] {
		return name, nil, &Failure{Name: "Replay", Error: ErrReplay.Error()}, http.StatusConflict
	}
	seqs := make(map[coordinator.Pubkey]uint64, len(r.seqs)+1)
	for k, v := range r.seqs {
		seqs[k] = v
	}
	seqs[req.Sender] = req.Sequence
	next := *r.state
	res, applyErr := next.Apply(ctx, ix)
	if applyErr != nil {
		next = *r.state // a rejected instruction changes nothing but the replay table
	}
	if _, free := ix.(*coordinator.FreeCoordinator); free && applyErr == nil {
		out, fail, status := s.freeRun(id, r, &res)
		return name, out, fail, status
	}
	if err := saveRun(s.dir, id, &next, seqs); err != nil {
		s.cfg.log.Error("persisting failed; the instruction is rejected", "run", id, "err", err)
		return name, nil, &Failure{Name: "Storage", Error: err.Error()}, http.StatusInternalServerError
	}
	r.seqs = seqs
	if applyErr != nil {
		return name, nil, failure(applyErr), http.StatusConflict
	}
	*r.state = next
	if res.Changed {
		r.notify()
		s.setMembers(id, r.state)
	}
	s.cfg.log.Debug("instruction", "run", id, "ix", ix.Name(), "from", res.From.String(), "to", res.To.String())
	return name, &Result{Changed: res.Changed, From: res.From.String(), To: res.To.String(), Nonce: next.Nonce}, nil, http.StatusOK
}

func (s *Server) initRun(id string, req *Request, ix *coordinator.InitCoordinator, ctx coordinator.Context) (*Result, *Failure, int) {
	if ix.RunID != req.RunID {
		return nil, &Failure{Name: "BadRequest", Error: "server: init_coordinator names another run than the request"}, http.StatusBadRequest
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, exists := s.runs[id]; exists {
		return nil, failure(coordinator.ErrAlreadyInitialized), http.StatusConflict
	}
	state := new(coordinator.Coordinator)
	res, err := state.Apply(ctx, ix)
	if err != nil {
		return nil, failure(err), http.StatusConflict
	}
	seqs := map[coordinator.Pubkey]uint64{req.Sender: req.Sequence}
	if err := saveRun(s.dir, id, state, seqs); err != nil {
		return nil, &Failure{Name: "Storage", Error: err.Error()}, http.StatusInternalServerError
	}
	s.runs[id] = newRun(state, seqs)
	s.setMembers(id, state)
	s.cfg.metrics.Runs.Set(float64(len(s.runs)))
	s.cfg.log.Info("run created", "run", id)
	return &Result{Changed: true, From: res.From.String(), To: res.To.String(), Nonce: state.Nonce}, nil, http.StatusOK
}

// freeRun deletes a run (the caller holds r.mu).
func (s *Server) freeRun(id string, r *run, res *coordinator.Result) (*Result, *Failure, int) {
	if err := os.Remove(runPath(s.dir, id)); err != nil && !os.IsNotExist(err) {
		return nil, &Failure{Name: "Storage", Error: err.Error()}, http.StatusInternalServerError
	}
	s.mu.Lock()
	delete(s.runs, id)
	s.cfg.metrics.Runs.Set(float64(len(s.runs)))
	s.mu.Unlock()
	s.setMembers(id, nil)
	for ch := range r.subs {
		close(ch)
		delete(r.subs, ch)
	}
	s.cfg.log.Info("run freed", "run", id)
	return &Result{Changed: true, From: res.From.String(), To: res.To.String(), Nonce: r.state.Nonce}, nil, http.StatusOK
}

func failure(err error) *Failure {
	var e *coordinator.Error
	if errors.As(err, &e) {
		return &Failure{Code: e.Code, Name: e.Name, Error: err.Error()}
	}
	return &Failure{Name: "Error", Error: err.Error()}
}

// subscribe registers a channel that receives the run's account on every
// change, starting with the current one.
func (s *Server) subscribe(id string) (chan []byte, func(), bool) {
	r := s.run(id)
	if r == nil {
		return nil, nil, false
	}
	ch := make(chan []byte, 1)
	r.mu.Lock()
	r.subs[ch] = struct{}{}
	ch <- r.state.MarshalAccount()
	r.mu.Unlock()
	s.cfg.metrics.Subscribers.Inc()
	var once sync.Once
	return ch, func() {
		once.Do(s.cfg.metrics.Subscribers.Dec)
		r.mu.Lock()
		if _, ok := r.subs[ch]; ok {
			delete(r.subs, ch)
		}
		r.mu.Unlock()
	}, true
}

const maxBody = 1 << 16

// Handler serves the HTTP API:
//
//	POST /v1/instructions          a signed request (see wire.go) → Result or Failure (JSON)
//	GET  /v1/runs                  run ids (JSON)
//	GET  /v1/runs/{id}             the account bytes
//	GET  /v1/runs/{id}/events      server-sent events, one base64 account per change
//	GET  /v1/p2p                   the p2p host's addresses and whether it relays (JSON P2PInfo; 404 without one)
//	GET  /healthz                  "ok"
//	GET  /                         the run explorer's page, WithPage (read-only)
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
		acct, ok := s.Account(req.PathValue("id"))
		if !ok {
			writeJSON(w, http.StatusNotFound, &Failure{Name: "RunNotFound", Error: "server: no such run"})
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(acct)
	})
	mux.HandleFunc("GET /v1/runs/{id}/events", func(w http.ResponseWriter, req *http.Request) {
		ch, cancel, ok := s.subscribe(req.PathValue("id"))
		if !ok {
			writeJSON(w, http.StatusNotFound, &Failure{Name: "RunNotFound", Error: "server: no such run"})
			return
		}
		defer cancel()
		flusher, _ := w.(http.Flusher)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		for {
			select {
			case <-req.Context().Done():
				return
			case acct, open := <-ch:
				if !open {
					return
				}
				if _, err := fmt.Fprintf(w, "data: %s\n\n", base64.StdEncoding.EncodeToString(acct)); err != nil {
					return
				}
				if flusher != nil {
					flusher.Flush()
				}
			}
		}
	})
	mux.HandleFunc("GET /v1/p2p", func(w http.ResponseWriter, _ *http.Request) {
		if s.cfg.p2p == nil {
			writeJSON(w, http.StatusNotFound, &Failure{Name: "NoP2P", Error: "server: this server runs no p2p host"})
			return
		}
		writeJSON(w, http.StatusOK, P2PInfo{Addrs: s.cfg.p2p.Addrs(), Relay: s.cfg.p2p.Relay()})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	if s.cfg.page != nil {
		mux.Handle("GET /", s.cfg.page)
	}
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Serve runs the HTTP API on l and ticks every run on the configured
// interval until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	t := time.NewTicker(s.cfg.interval)
	defer t.Stop()
	s.cfg.log.Info("server listening", "addr", l.Addr().String(), "dir", s.dir)
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
		}
	}
}

// Run listens on addr and serves until ctx ends.
func (s *Server) Run(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	return s.Serve(ctx, l)
}
