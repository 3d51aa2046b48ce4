package fedserver

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/secagg"
	"github.com/psyche-go/psyche/internal/httpserve"
)

// saRound is a run's secure aggregation round in progress: the pure
// secagg.Server, who is who, and the phase outputs clients wait for. It
// lives in memory only: a server restart aborts it, and its clients start
// the round again (nothing aggregated is lost: the model and round are
// persisted).
type saRound struct {
	base   uint64
	srv    *secagg.Server
	f      int
	ids    map[coordinator.Pubkey]secagg.ID
	pubs   map[secagg.ID]coordinator.Pubkey
	expect int // answers the open phase waits for
	got    int
	// reserved is how many of the round's slots fresh keys cannot take in
	// an open run: one for each recent contributor, up to capacity
	// (federated.State.RecentContributors); fresh counts the fresh keys
	// that took one.
	reserved, fresh int
	phase           secagg.Phase
	keys            []secagg.Keys
	inbox           map[secagg.ID][]secagg.Ciphertext
	survivors       []secagg.ID
	changed         chan struct{}
	timer           *time.Timer
	err             error // the round was aborted
}

func (s *Service) timeout(cfg *federated.Config) time.Duration {
	if cfg.SecAggTimeout == 0 {
		return 30 * time.Second
	}
	return time.Duration(cfg.SecAggTimeout) * time.Second
}

// advance moves sa to its next phase (callers hold fr.mu).
func (s *Service) advance(id string, fr *run, sa *saRound) {
	var err error
	switch sa.srv.Phase() {
	case secagg.PhaseAdvertise:
		sa.keys, err = sa.srv.CloseAdvertise()
		sa.expect = len(sa.keys)
	case secagg.PhaseShare:
		sa.inbox, err = sa.srv.CloseShares()
		sa.expect = len(sa.inbox)
	case secagg.PhaseMask:
		sa.survivors, err = sa.srv.CloseMasked()
		sa.expect = len(sa.survivors)
	case secagg.PhaseUnmask:
		err = s.finish(id, fr, sa)
	}
	sa.got = 0
	if sa.timer != nil {
		sa.timer.Stop()
	}
	if err != nil {
		sa.err = fmt.Errorf("fedserver: secure aggregation round %d aborted: %w", sa.base, err)
		s.log.Warn("secure aggregation round aborted", "run", id, "base", sa.base, "err", err)
	} else if sa.srv.Phase() != secagg.PhaseDone {
		s.arm(id, fr, sa)
	}
	sa.phase = sa.srv.Phase()
	close(sa.changed)
	sa.changed = make(chan struct{})
}

// arm starts the open phase's deadline: when it passes, the phase closes
// with the answers it has (which fails below the threshold).
func (s *Service) arm(id string, fr *run, sa *saRound) {
	phase := sa.srv.Phase()
	sa.timer = time.AfterFunc(s.timeout(&fr.m.State().Config), func() {
		fr.mu.Lock()
		defer fr.mu.Unlock()
		if fr.sa == sa && sa.err == nil && sa.srv.Phase() == phase {
			s.log.Info("secure aggregation phase deadline", "run", id, "base", sa.base, "phase", int(phase), "answers", sa.got, "of", sa.expect)
			s.advance(id, fr, sa)
		}
	})
}

func (s *Service) finish(id string, fr *run, sa *saRound) error {
	sum, err := sa.srv.Finish()
	if err != nil {
		return err
	}
	mean := secagg.Decode(sum, sa.f)
	k := float32(len(sa.survivors))
	for i := range mean {
		mean[i] /= k
	}
	clients := make([]coordinator.Pubkey, len(sa.survivors))
	for i, sid := range sa.survivors {
		clients[i] = sa.pubs[sid]
	}
	stepErr, storeErr := s.step(id, fr, federated.SumPush{Clients: clients, Base: sa.base, Mean: mean, Noise: s.noise(),
		Quantum: math.Ldexp(1, -sa.f)})
	if storeErr != nil {
		return storeErr
	}
	return stepErr
}

func (s *Service) secaggRequest(w http.ResponseWriter, id string, acct *coordinator.Coordinator, r *federated.Request) {
	outcome := "ok"
	defer func() { s.metrics.Updates.WithLabelValues(id, "secagg_"+outcome).Inc() }()
	refuse := func(status int, name string, err error) {
		outcome = name
		fail(w, status, name, err)
	}
	fr := s.current(id, acct)
	if fr == nil {
		refuse(http.StatusNotFound, "NotFederated", fmt.Errorf("fedserver: run %q is not federated", id))
		return
	}
	if halted(acct) {
		refuse(http.StatusConflict, "Paused", fmt.Errorf("fedserver: run %q is paused; updates are taken again when it resumes", id))
		return
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	st := fr.m.State()
	if !st.Config.SecAgg {
		refuse(http.StatusConflict, "Shape", fmt.Errorf("fedserver: run %q does not use secure aggregation", id))
		return
	}
	// Only members take part: strangers' keys cannot take a round's slots
	// (three fresh keys once held every slot, and the honest client waited
	// out the round with 409 Busy).
	if !st.IsMember(r.Signer) {
		refuse(http.StatusForbidden, "NotMember", federated.ErrNotMember)
		return
	}
	stale := func(base uint64) bool {
		if base == st.Round {
			return false
		}
		outcome = "Stale"
		httpserve.WriteJSON(w, http.StatusConflict, &federated.Failure{Name: "Stale", Round: st.Round,
			Error: (&federated.StaleError{Base: base, Round: st.Round}).Error()})
		return true
	}
	sa := fr.sa
	member := func(base uint64, claimed secagg.ID) bool {
		if sa == nil || sa.base != base || sa.err != nil {
			refuse(http.StatusConflict, "Aborted", fmt.Errorf("fedserver: no secure aggregation round %d under way; start again", base))
			return false
		}
		if sid, ok := sa.ids[r.Signer]; !ok || sid != claimed {
			refuse(http.StatusForbidden, "Forbidden", fmt.Errorf("fedserver: the signer is not client %d of round %d", claimed, base))
			return false
		}
		return true
	}
	var err error
	switch r.Kind {
	case federated.KindSecAggAdvertise:
		a, derr := secagg.DecodeAdvertisement(r.Payload)
		if derr != nil {
			refuse(http.StatusBadRequest, "BadRequest", derr)
			return
		}
		if stale(a.Base) {
			return
		}
		if sa == nil || sa.base != a.Base || sa.err != nil {
			f, ferr := secagg.FractionBits(int(st.Config.Capacity), float64(st.Config.Clip))
			srv, serr := secagg.NewServer(int(st.Config.SecAggThreshold), int(st.Config.SecAggNeighbors), len(st.Model))
			if ferr != nil || serr != nil {
				refuse(http.StatusInternalServerError, "Config", fmt.Errorf("fedserver: %v %v", ferr, serr))
				return
			}
			sa = &saRound{base: a.Base, srv: srv, f: f, ids: map[coordinator.Pubkey]secagg.ID{}, pubs: map[secagg.ID]coordinator.Pubkey{},
				expect: int(st.Config.Capacity), changed: make(chan struct{})}
			// A round of this base that failed (its clients did not all
			// come, or one sent no clipped update) shortens how far back a
			// contribution reserves a slot: when the recent contributors
			// have left, fresh keys get their slots after RecentRounds
			// tries, rather than the run waiting for them for ever.
			if old := fr.sa; old != nil && old.base == a.Base && old.err != nil {
				fr.misses++
			} else if old == nil || old.base != a.Base {
				fr.misses = 0
			}
			if acct.JoinAuthority.IsZero() {
				sa.reserved = min(int(st.Config.Capacity), st.RecentContributors(federated.RecentRounds-fr.misses))
			}
			fr.sa = sa
			s.arm(id, fr, sa)
		}
		if _, dup := sa.ids[r.Signer]; dup {
			refuse(http.StatusConflict, "Duplicate", fmt.Errorf("fedserver: this client already takes part in round %d", a.Base))
			return
		}
		if sa.srv.Phase() != secagg.PhaseAdvertise {
			refuse(http.StatusConflict, "Busy", fmt.Errorf("fedserver: round %d's secure aggregation is under way without this client; wait for the next round", a.Base))
			return
		}
		// In an open run anyone may join, so fresh keys could take every
		// slot before the clients of earlier rounds came (three did, and
		// the honest client was told Busy round after round): they take
		// only the slots that the recent contributors do not need.
		fresh := acct.JoinAuthority.IsZero() && !st.Contributor(r.Signer)
		if fresh && sa.fresh >= int(st.Config.Capacity)-sa.reserved {
			refuse(http.StatusConflict, "Busy", fmt.Errorf("fedserver: round %d's other %d slots are kept for clients of earlier rounds; a key new to this open run takes part once a slot is free (try the next round)",
				a.Base, sa.reserved))
			return
		}
		sid := secagg.ID(len(sa.ids) + 1)
		if err = sa.srv.Advertise(secagg.Keys{ID: sid, C: a.C, S: a.S}); err == nil {
			sa.ids[r.Signer], sa.pubs[sid] = sid, r.Signer
			sa.got++
			if fresh {
				sa.fresh++
			}
			httpserve.WriteJSON(w, http.StatusOK, &secagg.View{Base: sa.base, ID: sid, FractionBits: sa.f})
		}
	case federated.KindSecAggShares:
		base, from, cts, derr := secagg.DecodeShares(r.Payload)
		if derr != nil {
			refuse(http.StatusBadRequest, "BadRequest", derr)
			return
		}
		if stale(base) || !member(base, from) {
			return
		}
		if err = sa.srv.Shares(from, cts); err == nil {
			sa.got++
			httpserve.WriteJSON(w, http.StatusOK, &secagg.View{Base: base, ID: from})
		}
	case federated.KindSecAggMasked:
		base, from, y, derr := secagg.DecodeMasked(r.Payload)
		if derr != nil {
			refuse(http.StatusBadRequest, "BadRequest", derr)
			return
		}
		if stale(base) || !member(base, from) {
			return
		}
		if err = sa.srv.Masked(from, y); err == nil {
			sa.got++
			httpserve.WriteJSON(w, http.StatusOK, &secagg.View{Base: base, ID: from})
		}
	case federated.KindSecAggReveal:
		base, rv, derr := secagg.DecodeReveal(r.Payload)
		if derr != nil {
			refuse(http.StatusBadRequest, "BadRequest", derr)
			return
		}
		if stale(base) || !member(base, rv.From) {
			return
		}
		if err = sa.srv.Unmask(rv); err == nil {
			sa.got++
			httpserve.WriteJSON(w, http.StatusOK, &secagg.View{Base: base, ID: rv.From})
		}
	}
	if err != nil {
		refuse(http.StatusConflict, "Protocol", err)
		return
	}
	if sa.got >= sa.expect {
		s.advance(id, fr, sa)
	}
}

// handleSecAgg answers GET /v1/runs/{id}/federated/secagg?base=R&phase=P&id=N,
// waiting (up to 20 s, then 204) until round R's phase P (keys, inbox or
// survivors) has closed.
func (s *Service) handleSecAgg(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	fr := s.run(id)
	q := req.URL.Query()
	base, err1 := strconv.ParseUint(q.Get("base"), 10, 64)
	who, err2 := strconv.ParseUint(q.Get("id"), 10, 8)
	want := map[string]secagg.Phase{"keys": secagg.PhaseShare, "inbox": secagg.PhaseMask, "survivors": secagg.PhaseUnmask, "done": secagg.PhaseDone}[q.Get("phase")]
	if fr == nil || err1 != nil || err2 != nil || want == 0 {
		fail(w, http.StatusBadRequest, "BadRequest", fmt.Errorf("fedserver: want a federated run, base=R, phase=keys|inbox|survivors|done and id=N"))
		return
	}
	s.longPoll(w, req, fr, func() (func(), <-chan struct{}) {
		sa := fr.sa
		if sa == nil || sa.base != base || sa.err != nil {
			msg := fmt.Sprintf("fedserver: no secure aggregation round %d under way; start again", base)
			if sa != nil && sa.base == base && sa.err != nil {
				msg = sa.err.Error()
			}
			return func() { fail(w, http.StatusConflict, "Aborted", errors.New(msg)) }, nil
		}
		if sa.phase < want {
			return nil, sa.changed
		}
		v := &secagg.View{Base: base, ID: secagg.ID(who), FractionBits: sa.f}
		switch want {
		case secagg.PhaseShare:
			v.Keys = sa.keys
		case secagg.PhaseMask:
			v.Inbox = sa.inbox[secagg.ID(who)]
		case secagg.PhaseUnmask:
			v.Survivors = sa.survivors
		}
		return func() { httpserve.WriteJSON(w, http.StatusOK, v) }, nil
	})
}
