package p2p

import "errors"

// Sentinel errors. Callers match them with errors.Is; the wrapped message
// carries the detail (which field, which peer).
var (
	// Wire formats.
	ErrShortBuffer     = errors.New("p2p: message truncated")
	ErrTrailingBytes   = errors.New("p2p: trailing bytes after message")
	ErrVersion         = errors.New("p2p: unknown encoding version")
	ErrOversize        = errors.New("p2p: message too large")
	ErrMalformed       = errors.New("p2p: malformed message")
	ErrBadSignature    = errors.New("p2p: bad signature")
	ErrWrongRun        = errors.New("p2p: announcement for another run")
	ErrStepOutOfWindow = errors.New("p2p: step outside [current-2, current+1]")
	ErrNotAssigned     = errors.New("p2p: sender is not the assigned trainer of the batch")
	ErrReplayed        = errors.New("p2p: announcement already seen")

	// Blobs and checkpoints.
	ErrCommitmentMismatch = errors.New("p2p: payload does not match the announced commitment")
	ErrBlockMismatch      = errors.New("p2p: block does not hash to its identifier")
	ErrFetchFailed        = errors.New("p2p: fetch failed after retries")
	ErrNoCheckpoint       = errors.New("p2p: no peer offers a checkpoint")
	// ErrNoHolder comes with ErrNoCheckpoint when every peer asked answered
	// and none holds the checkpoint (they restarted, say): waiting for them
	// will not help, unlike when some could not be reached.
	ErrNoHolder           = errors.New("p2p: every peer asked holds no checkpoint")
	ErrCheckpointDisputed = errors.New("p2p: peers offer different checkpoints")

	// Node.
	ErrConfig     = errors.New("p2p: invalid configuration")
	ErrOptionSet  = errors.New("p2p: option set twice")
	ErrKeyFile    = errors.New("p2p: bad key file")
	ErrBadAddress = errors.New("p2p: bad peer address")
	ErrClosed     = errors.New("p2p: node closed")
)
