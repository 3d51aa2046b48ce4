package fedserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/internal/httpserve"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

func fail(w http.ResponseWriter, status int, name string, err error) {
	httpserve.WriteJSON(w, status, &federated.Failure{Name: name, Error: err.Error()})
}

// MaxInflight bounds the bytes of request bodies the service holds at once,
// across all requests: a body can be verified only once it is whole, so
// strangers' unsigned bodies are bounded here (each also by its run's model,
// MaxPayloadFor). Past it a request is refused with 503 and retried.
const MaxInflight = 256 << 20

// handleRequest reads a signed request in two steps: the header, which names
// the run and the payload's size, then, only if the run exists and the size
// is within what its model allows (and within MaxInflight), the rest. A
// stranger's body is thus never read whole, or allocated for, beyond what
// the run could need (B6: 16 concurrent unsigned 64 MiB bodies to any run
// took the server to 1.7 GB).
func (s *Service) handleRequest(w http.ResponseWriter, req *http.Request) {
	body := http.MaxBytesReader(w, req.Body, federated.MaxRequest)
	head := make([]byte, federated.RequestHeaderSize)
	if _, err := io.ReadFull(body, head); err != nil {
		fail(w, http.StatusBadRequest, "BadRequest", fmt.Errorf("fedserver: reading the request's header: %w", err))
		return
	}
	h, err := federated.PeekRequest(head)
	if err != nil {
		fail(w, http.StatusBadRequest, "BadRequest", err)
		return
	}
	id := h.RunID
	if s.quarantine(w, id) {
		return
	}
	acct, ok := s.account(id)
	if !ok {
		fail(w, http.StatusNotFound, "RunNotFound", fmt.Errorf("fedserver: no run %q", id))
		return
	}
	params := s.params(id, acct)
	if h.Kind != federated.KindConfig && params == 0 {
		fail(w, http.StatusNotFound, "NotFederated", fmt.Errorf("fedserver: run %q is not federated (its run file has no [federated] section)", id))
		return
	}
	if limit := federated.MaxPayloadFor(h.Kind, params); h.PayloadLen > limit {
		fail(w, http.StatusRequestEntityTooLarge, "TooLarge", fmt.Errorf("fedserver: a payload of %d bytes; run %q's model (%d values) allows at most %d for this request",
			h.PayloadLen, id, params, limit))
		return
	}
	if !s.reserve(h.Rest()) {
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusServiceUnavailable, "Busy", fmt.Errorf("fedserver: the server holds %d bytes of requests; retry", MaxInflight))
		return
	}
	defer s.release(h.Rest())
	full := make([]byte, federated.RequestHeaderSize+h.Rest())
	copy(full, head)
	if _, err := io.ReadFull(body, full[federated.RequestHeaderSize:]); err != nil {
		fail(w, http.StatusBadRequest, "BadRequest", fmt.Errorf("fedserver: reading the request: %w", err))
		return
	}
	if n, _ := body.Read(make([]byte, 1)); n > 0 {
		fail(w, http.StatusBadRequest, "BadRequest", fmt.Errorf("%w: data after the request", federated.ErrMalformed))
		return
	}
	r, err := federated.DecodeRequest(full)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, federated.ErrSignature) {
			status = http.StatusUnauthorized
		}
		fail(w, status, "BadRequest", err)
		return
	}
	switch r.Kind {
	case federated.KindConfig:
		s.configure(w, id, acct, r)
	case federated.KindUpdate:
		s.update(w, id, acct, r)
	case federated.KindJoin:
		s.join(w, id, acct, r)
	default:
		s.secaggRequest(w, id, acct, r)
	}
}

// step applies msg to the run's machine and persists the result before it
// returns; a refusal or a failed write leaves the previous state in place
// (a refusal's replay entry is kept and persisted).
func (s *Service) step(id string, fr *run, msg federated.Msg) (stepErr error, storeErr error) {
	prev := fr.m.State().Clone()
	stepErr = fr.m.Step(msg)
	rd := fr.m.Ready()
	if rd.Persist {
		if err := s.writeState(id, fr); err != nil {
			fr.m, _ = federated.Restore(prev)
			s.log.Error("persisting a federated run failed; the request is refused", "run", id, "err", err)
			return stepErr, fmt.Errorf("fedserver: writing %s: %w", s.path(id), err)
		}
	}
	fr.m.Advance()
	st := fr.m.State()
	for _, a := range rd.Aggregated {
		if a.Dropped {
			s.log.Error("a federated step that would make the model non-finite was dropped", "run", id, "round", a.Round, "updates", a.Updates)
			continue
		}
		s.log.Info("federated round aggregated", "run", id, "round", a.Round, "updates", a.Updates, "step_norm", a.Norm)
	}
	if len(rd.Aggregated) > 0 {
		close(fr.changed)
		fr.changed = make(chan struct{})
	}
	s.observe(id, st)
	return stepErr, nil
}

func (s *Service) configure(w http.ResponseWriter, id string, acct *coordinator.Coordinator, r *federated.Request) {
	if r.Signer != acct.MainAuthority {
		fail(w, http.StatusForbidden, "Forbidden", fmt.Errorf("fedserver: only the run's authority %s may configure it", acct.MainAuthority))
		return
	}
	cfg, err := federated.DecodeConfig(r.Payload)
	if err != nil {
		fail(w, http.StatusBadRequest, "BadRequest", err)
		return
	}
	if cfg.SecAgg && acct.Model.Optimizer.Kind == coordinator.OptimizerDistro {
		fail(w, http.StatusBadRequest, "Config", fmt.Errorf("%w: secure aggregation sums dense updates; this run's optimizer is distro (top-k indices would leak): use adamw", federated.ErrConfig))
		return
	}
	fr := s.current(id, acct)
	s.mu.Lock()
	if fr == nil {
		// No state, or a freed run's under the same id: the first config
		// of this run starts it afresh (and replaces that file).
		// The first config starts the run from the coordinator's model.
		params, err := initialModel(acct)
		if err != nil {
			s.mu.Unlock()
			fail(w, http.StatusConflict, "NoModel", err)
			return
		}
		m, err := federated.New(*cfg, params)
		if err == nil {
			m.State().Owner = acct.MainAuthority
			err = m.Step(federated.Configure{Signer: r.Signer, Seq: r.Sequence, Config: *cfg})
		}
		if err != nil {
			s.mu.Unlock()
			fail(w, http.StatusBadRequest, "BadRequest", err)
			return
		}
		fr := &run{m: m, changed: make(chan struct{})}
		if err := s.writeState(id, fr); err != nil {
			s.mu.Unlock()
			fail(w, http.StatusInternalServerError, "Storage", err)
			return
		}
		m.Advance()
		s.runs[id] = fr
		s.mu.Unlock()
		s.observe(id, m.State())
		s.log.Info("federated run created", "run", id, "params", len(params), "capacity", cfg.Capacity)
		s.onRun(id)
		httpserve.WriteJSON(w, http.StatusOK, federated.InfoOf(id, m.State(), halted(acct)))
		return
	}
	s.mu.Unlock()
	fr.mu.Lock()
	defer fr.mu.Unlock()
	stepErr, storeErr := s.step(id, fr, federated.Configure{Signer: r.Signer, Seq: r.Sequence, Config: *cfg})
	switch {
	case storeErr != nil:
		fail(w, http.StatusInternalServerError, "Storage", storeErr)
	case stepErr != nil:
		fail(w, http.StatusConflict, failureName(stepErr), stepErr)
	default:
		close(fr.changed)
		fr.changed = make(chan struct{})
		s.log.Info("federated run reconfigured", "run", id, "capacity", cfg.Capacity)
		httpserve.WriteJSON(w, http.StatusOK, federated.InfoOf(id, fr.m.State(), halted(acct)))
	}
}

// halted reports whether the coordinator holds the run still: paused, or
// never resumed since it was created. Federated updates wait for it.
func halted(acct *coordinator.Coordinator) bool {
	return acct.RunState == coordinator.Paused || acct.RunState == coordinator.Uninitialized
}

// initialModel is the run's starting model: its checkpoint URL's seed or
// file.
func initialModel(acct *coordinator.Coordinator) ([]float32, error) {
	url := coordinator.FixedString(acct.Model.Checkpoint.Source.URL[:])
	src, err := modelspec.ParseSource(url)
	if err != nil {
		return nil, fmt.Errorf("fedserver: the run's model: %w", err)
	}
	// Federated clients train GPT models (fedclient): a run of another
	// architecture is refused here, with the reason.
	cfg, err := modelspec.GPT(&acct.Model)
	if err != nil {
		return nil, fmt.Errorf("fedserver: %w", err)
	}
	var m *gpt.Model
	switch src.Kind {
	case modelspec.FromSeed:
		m, err = gpt.New(cfg, src.Seed, nil)
	case modelspec.FromFile:
		m, err = gpt.Load(src.Path, nil)
	default:
		err = fmt.Errorf("fedserver: a federated run starts from seed:N or file://, not %q", url)
	}
	if err != nil {
		return nil, err
	}
	return m.Params, nil
}

func failureName(err error) string {
	switch {
	case errors.Is(err, federated.ErrStale):
		return "Stale"
	case errors.Is(err, federated.ErrReplay):
		return "Replay"
	case errors.Is(err, federated.ErrShape), errors.Is(err, federated.ErrNonFinite), errors.Is(err, federated.ErrEncoding),
		errors.Is(err, federated.ErrTooLarge):
		return "Shape"
	case errors.Is(err, federated.ErrFinished):
		return "Finished"
	case errors.Is(err, federated.ErrDuplicate):
		return "Duplicate"
	case errors.Is(err, federated.ErrFuture):
		return "Future"
	case errors.Is(err, federated.ErrConfig):
		return "Config"
	case errors.Is(err, federated.ErrNotMember):
		return "NotMember"
	case errors.Is(err, federated.ErrFull):
		return "Full"
	}
	return "Error"
}

// join makes the signer a member of the run: anyone, where the run has no
// join authority (up to federated.MaxMembers); otherwise only a key the
// authority signed a join token for.
func (s *Service) join(w http.ResponseWriter, id string, acct *coordinator.Coordinator, r *federated.Request) {
	fr := s.current(id, acct)
	if fr == nil {
		fail(w, http.StatusNotFound, "NotFederated", fmt.Errorf("fedserver: run %q is not federated (its run file has no [federated] section)", id))
		return
	}
	if ja := acct.JoinAuthority; !ja.IsZero() && !federated.VerifyJoinToken(ja, id, r.Signer, r.Payload) {
		fail(w, http.StatusForbidden, "Forbidden", fmt.Errorf("fedserver: run %q has a join authority (%s): joining takes its token for your key %s (psyche federated-token, then psyche join --join-token)",
			id, ja, r.Signer))
		return
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	// A join changes the signer's membership and sequence number only: it
	// is appended to the run's journal (joinlog.go), not written with the
	// whole state.
	st := fr.m.State()
	k := r.Signer
	wasMember := st.Members[k]
	seq, hadSeq := st.Seqs[k]
	if err := fr.m.Step(federated.Join{Client: k, Seq: r.Sequence}); err != nil {
		fr.m.Advance()
		fail(w, http.StatusConflict, failureName(err), err)
		return
	}
	if !s.appendJoin(id, fr, k, r.Sequence) {
		if err := s.writeState(id, fr); err != nil {
			// Not stored, so not taken: the state is as it was.
			if !wasMember {
				delete(st.Members, k)
			}
			if hadSeq {
				st.Seqs[k] = seq
			} else {
				delete(st.Seqs, k)
			}
			fr.m.Advance()
			s.log.Error("persisting a federated join failed; it is refused", "run", id, "err", err)
			fail(w, http.StatusInternalServerError, "Storage", fmt.Errorf("fedserver: writing %s: %w", s.path(id), err))
			return
		}
	}
	fr.m.Advance()
	httpserve.WriteJSON(w, http.StatusOK, federated.InfoOf(id, st, halted(acct)))
}

func (s *Service) update(w http.ResponseWriter, id string, acct *coordinator.Coordinator, r *federated.Request) {
	outcome := "ok"
	defer func() { s.metrics.Updates.WithLabelValues(id, outcome).Inc() }()
	fr := s.current(id, acct)
	if fr == nil {
		outcome = "NotFederated"
		fail(w, http.StatusNotFound, outcome, fmt.Errorf("fedserver: run %q is not federated (its run file has no [federated] section)", id))
		return
	}
	if halted(acct) {
		outcome = "Paused"
		fail(w, http.StatusConflict, outcome, fmt.Errorf("fedserver: run %q is paused (or not started yet); updates are taken once it is resumed (psyche set-paused --resume)", id))
		return
	}
	u, err := federated.DecodeUpdate(r.Payload)
	if err != nil {
		outcome = "BadRequest"
		fail(w, http.StatusBadRequest, outcome, err)
		return
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	delta := u.Delta
	if u.Frame != nil {
		if delta, err = fr.decompress(acct, u.Frame); err != nil {
			outcome = failureName(err)
			fail(w, http.StatusBadRequest, outcome, err)
			return
		}
	} else if acct.Model.Optimizer.Kind == coordinator.OptimizerDistro {
		outcome = "Shape"
		fail(w, http.StatusBadRequest, outcome, fmt.Errorf("%w: run %q's optimizer is distro: it takes DisTrO-compressed updates", federated.ErrEncoding, id))
		return
	}
	stepErr, storeErr := s.step(id, fr, federated.Push{Client: r.Signer, Seq: r.Sequence, Base: u.Base, Steps: u.Steps,
		Delta: delta, Noise: s.noise()})
	st := fr.m.State()
	switch {
	case storeErr != nil:
		outcome = "Storage"
		fail(w, http.StatusInternalServerError, outcome, storeErr)
	case stepErr != nil:
		outcome = failureName(stepErr)
		status := http.StatusConflict
		if errors.Is(stepErr, federated.ErrNotMember) {
			status = http.StatusForbidden
		}
		s.log.Debug("federated update refused", "run", id, "client", r.Signer.String(), "reason", outcome, "base", u.Base, "round", st.Round)
		httpserve.WriteJSON(w, status, &federated.Failure{Name: outcome, Error: stepErr.Error(), Round: st.Round})
	default:
		httpserve.WriteJSON(w, http.StatusOK, &federated.PushResult{Round: st.Round, Buffered: len(st.Buffer), Capacity: st.Config.Capacity})
	}
}

// federatedRun is the federated run a read names (its path's id) and its
// account (nil when the run is gone), or false once it has answered why
// there is none.
func (s *Service) federatedRun(w http.ResponseWriter, req *http.Request) (string, *run, *coordinator.Coordinator, bool) {
	id := req.PathValue("id")
	if s.quarantine(w, id) {
		return "", nil, nil, false
	}
	acct, ok := s.account(id)
	if !ok {
		acct = nil
	}
	fr := s.current(id, acct)
	if fr == nil {
		fail(w, http.StatusNotFound, "NotFederated", fmt.Errorf("fedserver: no federated run %q", id))
		return "", nil, nil, false
	}
	return id, fr, acct, true
}

func (s *Service) handleInfo(w http.ResponseWriter, req *http.Request) {
	id, fr, acct, ok := s.federatedRun(w, req)
	if !ok {
		return
	}
	fr.mu.Lock()
	info := federated.InfoOf(id, fr.m.State(), halted(acct))
	fr.mu.Unlock()
	httpserve.WriteJSON(w, http.StatusOK, info)
}

func (s *Service) handleModel(w http.ResponseWriter, req *http.Request) {
	_, fr, _, ok := s.federatedRun(w, req)
	if !ok {
		return
	}
	after := int64(-1)
	if a := req.URL.Query().Get("after"); a != "" {
		v, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			fail(w, http.StatusBadRequest, "BadRequest", fmt.Errorf("fedserver: after=%q", a))
			return
		}
		after = v
	}
	s.longPoll(w, req, fr, func() (func(), <-chan struct{}) {
		st := fr.m.State()
		if int64(st.Round) <= after && !st.Finished() {
			return nil, fr.changed
		}
		b := federated.EncodeModel(st.Round, st.Model)
		return func() {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(b)
		}, nil
	})
}

// longPoll answers a read that waits for the run to move: ready, called
// with fr.mu held, returns the answer to write once the lock is released,
// or else the channel closed at the next change. After s.maxWait with
// nothing to say it answers 204, and the client asks again.
func (s *Service) longPoll(w http.ResponseWriter, req *http.Request, fr *run, ready func() (answer func(), changed <-chan struct{})) {
	ctx, cancel := context.WithTimeout(req.Context(), s.maxWait)
	defer cancel()
	for {
		fr.mu.Lock()
		answer, ch := ready()
		fr.mu.Unlock()
		if answer != nil {
			answer()
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
}
