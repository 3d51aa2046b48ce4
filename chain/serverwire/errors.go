package serverwire

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
)

// Refusals the server makes before a request reaches the coordinator. Each
// travels as a Failure whose Name is the key of refusals, with the HTTP
// status beside it, and turns back into the same error on the client's side (Failure.Err), so
// errors.Is works across the network. Nothing a refused request carries is
// stored.
var (
	ErrInvalidRunID       = errors.New("server: invalid run id")
	ErrNotMainAuthority   = errors.New("server: init_coordinator must be signed by the main authority it names")
	ErrNotCreator         = errors.New("server: this key may not create runs on this server (psyche server --creators)")
	ErrCreatorQuota       = errors.New("server: this key holds as many runs as the server allows (free one, or psyche server --creator-quota)")
	ErrQuarantined        = errors.New("server: run quarantined: its state file cannot be trusted")
	ErrTooManySubscribers = errors.New("server: too many event streams")
	ErrStorage            = errors.New("server: persisting the run failed")
)

// refusals maps a Failure's Name to its error and HTTP status.
var refusals = map[string]struct {
	err    error
	status int
}{
	"BadRequest":         {ErrBadRequest, http.StatusBadRequest},
	"BadSignature":       {ErrSignature, http.StatusUnauthorized},
	"InvalidRunID":       {ErrInvalidRunID, http.StatusBadRequest},
	"Stale":              {ErrStale, http.StatusConflict},
	"Replay":             {ErrReplay, http.StatusConflict},
	"NotMainAuthority":   {ErrNotMainAuthority, http.StatusForbidden},
	"NotCreator":         {ErrNotCreator, http.StatusForbidden},
	"CreatorQuota":       {ErrCreatorQuota, http.StatusForbidden},
	"Quarantined":        {ErrQuarantined, http.StatusServiceUnavailable},
	"TooManySubscribers": {ErrTooManySubscribers, http.StatusTooManyRequests},
	"Storage":            {ErrStorage, http.StatusInternalServerError},
}

// Refuse builds the Failure and status for one of the refusals; detail
// (may be empty) says what exactly was wrong.
func Refuse(name, detail string) (*Failure, int) {
	r := refusals[name]
	msg := r.err.Error()
	if detail != "" {
		msg += ": " + detail
	}
	return &Failure{Name: name, Error: msg}, r.status
}

// Err turns a failure back into the error the server saw: coordinator
// errors and the server's refusals keep their identity, so errors.Is works
// across the network.
func (f *Failure) Err() error {
	if e := coordinator.ErrorFromCode(f.Code); e != nil {
		// The failure's text is the error's own, perhaps with a detail
		// after it: only a detail is added (the text said everything
		// twice: "already initialized (coordinator: … already initialized)").
		detail := strings.TrimPrefix(strings.TrimPrefix(f.Error, e.Error()), ": ")
		if detail == "" {
			return e
		}
		return fmt.Errorf("%w (%s)", e, detail)
	}
	if f.Name == "RunNotFound" {
		return fmt.Errorf("%w: %s", chain.ErrRunNotFound, f.Error)
	}
	if r, ok := refusals[f.Name]; ok {
		if detail := strings.TrimPrefix(f.Error, r.err.Error()); detail != f.Error {
			return fmt.Errorf("%w%s", r.err, detail)
		}
		return fmt.Errorf("%w: %s", r.err, f.Error)
	}
	return errors.New(f.Error)
}
