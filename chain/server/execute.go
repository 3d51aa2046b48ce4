package server

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/psyche-go/psyche/chain/serverwire"
	"github.com/psyche-go/psyche/coordinator"
)

// checkRunID refuses what cannot be a run id here: what ParseRunID refuses,
// and ids starting with "." (the server's temporary files start with ".",
// and a run stored as a hidden file would be skipped when loading, then
// free to be created again by another key).
func checkRunID(id string) error {
	if _, err := coordinator.ParseRunID(id); err != nil {
		return fmt.Errorf("%w: %w", serverwire.ErrInvalidRunID, err)
	}
	if strings.HasPrefix(id, ".") {
		return fmt.Errorf("%w: %q starts with \".\" (refused by the server backend, whose temporary files start with \".\")", serverwire.ErrInvalidRunID, id)
	}
	return nil
}

// refuseRunID is the refusal for an error of checkRunID.
func refuseRunID(err error) (*serverwire.Failure, int) {
	return serverwire.Refuse("InvalidRunID", strings.TrimPrefix(err.Error(), serverwire.ErrInvalidRunID.Error()+": "))
}

// Execute verifies and applies one encoded request. It returns the HTTP
// status that goes with the outcome.
func (s *Server) Execute(body []byte) (*serverwire.Result, *serverwire.Failure, int) {
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
func (s *Server) execute(body []byte) (name string, _ *serverwire.Result, _ *serverwire.Failure, _ int) {
	name = "?"
	req, err := serverwire.DecodeRequest(body)
	if err != nil {
		if errors.Is(err, serverwire.ErrSignature) {
			f, st := serverwire.Refuse("BadSignature", strings.TrimPrefix(err.Error(), serverwire.ErrSignature.Error()+": "))
			return name, nil, f, st
		}
		f, st := serverwire.Refuse("BadRequest", strings.TrimPrefix(err.Error(), serverwire.ErrBadRequest.Error()+": "))
		return name, nil, f, st
	}
	ix, err := coordinator.DecodeInstruction(req.Data)
	if err != nil {
		return name, nil, failure(err), http.StatusBadRequest
	}
	name = ix.Name()
	if req.Server != s.id {
		f, st := serverwire.Refuse("Stale", fmt.Sprintf("signed for server %x, this is %x", req.Server[:8], s.id[:8]))
		return name, nil, f, st
	}
	id := coordinator.FixedString(req.RunID[:])
	if err := checkRunID(id); err != nil {
		f, st := refuseRunID(err)
		return name, nil, f, st
	}
	if packed, _ := coordinator.ParseRunID(id); packed != req.RunID {
		f, st := serverwire.Refuse("InvalidRunID", fmt.Sprintf("%q is followed by bytes other than zero padding", id))
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
		return name, nil, &serverwire.Failure{Name: "RunNotFound", Error: fmt.Sprintf("server: no run %q", id)}, http.StatusNotFound
	}
	if req.Incarnation != r.incarnation {
		f, st := serverwire.Refuse("Stale", fmt.Sprintf("signed for incarnation %d of run %q, which is at %d", req.Incarnation, id, r.incarnation))
		return name, nil, f, st
	}
	if req.Sequence <= r.replay.last(req.Sender) {
		f, st := serverwire.Refuse("Replay", "")
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
	out := &serverwire.Result{Changed: res.Changed, From: res.From.String(), To: res.To.String(), Nonce: next.Nonce, Incarnation: r.incarnation}
	if !res.Changed {
		// Nothing to persist, so nothing is stored: replaying a request
		// that changed nothing (a tick with nothing due, a join that was
		// already there) is no more than its signer may do anyway.
		return name, out, nil, http.StatusOK
	}
	replay := r.replay.record(&next, req.Sender, req.Sequence)
	if err := saveRun(s.dir, id, &stored{incarnation: r.incarnation, state: &next, replay: replay}); err != nil {
		s.cfg.log.Error("persisting failed; the instruction is rejected", "run", id, "err", err)
		f, st := serverwire.Refuse("Storage", err.Error())
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
func (s *Server) checkWindow(seq uint64) (*serverwire.Failure, int) {
	now := time.Now().UnixNano()
	w := s.cfg.window.Nanoseconds()
	if d := int64(seq - uint64(now)); d > w || d < -w {
		return serverwire.Refuse("Stale", fmt.Sprintf("sequence %d is %v from the server's clock, more than the window of %v (fetch the binding again)",
			seq, time.Duration(d).Round(time.Millisecond), s.cfg.window))
	}
	return nil, 0
}

// liveRun finds a run, or says why there is none.
func (s *Server) liveRun(id string) (*run, *serverwire.Failure, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err, bad := s.quarantined[id]; bad {
		f, st := serverwire.Refuse("Quarantined", err.Error())
		return nil, f, st
	}
	if r := s.runs[id]; r != nil {
		return r, nil, 0
	}
	return nil, &serverwire.Failure{Name: "RunNotFound", Error: fmt.Sprintf("server: no run %q", id)}, http.StatusNotFound
}

func (s *Server) initRun(id string, req *serverwire.Request, ix *coordinator.InitCoordinator, ctx coordinator.Context) (*serverwire.Result, *serverwire.Failure, int) {
	if ix.RunID != req.RunID {
		f, st := serverwire.Refuse("BadRequest", "init_coordinator names another run than the request")
		return nil, f, st
	}
	if req.Sender != ix.MainAuthority {
		f, st := serverwire.Refuse("NotMainAuthority", fmt.Sprintf("signed by %s, names %s", req.Sender, ix.MainAuthority))
		return nil, f, st
	}
	if _, ok := s.cfg.creators[req.Sender]; !ok && !s.cfg.anyCreator {
		f, st := serverwire.Refuse("NotCreator", req.Sender.String())
		return nil, f, st
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err, bad := s.quarantined[id]; bad {
		f, st := serverwire.Refuse("Quarantined", err.Error())
		return nil, f, st
	}
	if _, exists := s.runs[id]; exists {
		return nil, failure(coordinator.ErrAlreadyInitialized), http.StatusConflict
	}
	if want := s.freed[id] + 1; req.Incarnation != want {
		f, st := serverwire.Refuse("Stale", fmt.Sprintf("init_coordinator signed for incarnation %d of run %q, the next is %d", req.Incarnation, id, want))
		return nil, f, st
	}
	if s.owned[req.Sender] >= s.cfg.quota {
		f, st := serverwire.Refuse("CreatorQuota", fmt.Sprintf("%s holds %d runs", req.Sender, s.owned[req.Sender]))
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
		f, status := serverwire.Refuse("Storage", err.Error())
		return nil, f, status
	}
	r := newRun(st)
	s.runs[id] = r
	delete(s.freed, id)
	s.owned[r.creator]++
	s.setMembers(id, state)
	s.cfg.metrics.Runs.Set(float64(len(s.runs)))
	s.cfg.log.Info("run created", "run", id, "incarnation", st.incarnation, "creator", req.Sender.String())
	return &serverwire.Result{Changed: true, From: res.From.String(), To: res.To.String(), Nonce: state.Nonce, Incarnation: st.incarnation}, nil, http.StatusOK
}

// freeRun deletes a run (the caller holds r.mu): its file becomes a
// tombstone that keeps its incarnation, so the id's next init is signed for
// the next one and nothing signed for this one applies again.
func (s *Server) freeRun(id string, r *run, res *coordinator.Result) (*serverwire.Result, *serverwire.Failure, int) {
	if err := saveRun(s.dir, id, &stored{incarnation: r.incarnation, freed: true}); err != nil {
		f, st := serverwire.Refuse("Storage", err.Error())
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
	return &serverwire.Result{Changed: true, From: res.From.String(), To: res.To.String(), Nonce: r.state.Nonce, Incarnation: r.incarnation}, nil, http.StatusOK
}

func failure(err error) *serverwire.Failure {
	var e *coordinator.Error
	if errors.As(err, &e) {
		return &serverwire.Failure{Code: e.Code, Name: e.Name, Error: err.Error()}
	}
	return &serverwire.Failure{Name: "Error", Error: err.Error()}
}

// Binding is what a request for run id must be signed for (see Binding).
func (s *Server) Binding(id string) (serverwire.Binding, *serverwire.Failure, int) {
	if err := checkRunID(id); err != nil {
		f, st := refuseRunID(err)
		return serverwire.Binding{}, f, st
	}
	b := serverwire.Binding{Server: s.id}
	s.mu.Lock()
	if err, bad := s.quarantined[id]; bad {
		s.mu.Unlock()
		f, st := serverwire.Refuse("Quarantined", err.Error())
		return serverwire.Binding{}, f, st
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
