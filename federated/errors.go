package federated

import (
	"errors"
	"fmt"
)

var (
	ErrConfig     = errors.New("federated: bad config")
	ErrShape      = errors.New("federated: update of the wrong shape")
	ErrNonFinite  = errors.New("federated: update holds a NaN or an infinity")
	ErrTooLarge   = errors.New("federated: update value past the bound an update can have (MaxUpdateValue)")
	ErrNotClipped = errors.New("federated: a secure aggregation round's mean is larger than clipped updates allow")
	ErrNotMember  = errors.New("federated: not a member of the run: join it first (psyche join --local-data joins by itself; a run with a join authority needs its --join-token)")
	ErrFull       = errors.New("federated: the run has as many members as it takes")
	ErrDuplicate  = errors.New("federated: this client already has an update in the buffer for this round")
	ErrReplay     = errors.New("federated: sequence number already used (replayed or out of order)")
	ErrFinished   = errors.New("federated: the run has done all its rounds")
	ErrFuture     = errors.New("federated: update trained on a round the server has not reached")
	ErrMalformed  = errors.New("federated: malformed message")
	ErrSignature  = errors.New("federated: bad signature")
	ErrEncoding   = errors.New("federated: update encoding does not match the run (dense or secure aggregation)")
)

// StaleError refuses an update trained on a round older than the server's
// allows: the client fetches the current model and trains again.
type StaleError struct {
	Base, Round  uint64
	MaxStaleness uint32
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("federated: stale update: trained on round %d, the server is at round %d and accepts updates at most %d rounds old; fetch the current model and train again",
		e.Base, e.Round, e.MaxStaleness)
}

// ErrStale matches every *StaleError with errors.Is.
var ErrStale = errors.New("federated: stale update")

func (e *StaleError) Is(target error) bool { return target == ErrStale }
