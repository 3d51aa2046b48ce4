package coordinator

import "errors"

// Error is a coordinator error with a stable numeric code. The on-chain
// program returns the same codes as custom program errors, so a failed
// transaction maps back to the same Go error with ErrorFromCode.
type Error struct {
	Code uint32
	Name string
	msg  string
}

func (e *Error) Error() string { return "coordinator: " + e.msg }

// Custom program error codes start at 6000, like Anchor's, so they never
// collide with the runtime's built-in errors.
const firstErrorCode = 6000

var errorTable []*Error

func newError(code uint32, name, msg string) *Error {
	e := &Error{Code: code, Name: name, msg: msg}
	errorTable = append(errorTable, e)
	return e
}

// The codes below are part of the ABI: never renumber, only append.
var (
	// Bytes from outside.
	ErrMalformed          = newError(6000, "Malformed", "malformed data")
	ErrTruncated          = newError(6001, "Truncated", "truncated data")
	ErrWrongSize          = newError(6002, "WrongSize", "wrong size")
	ErrWrongDiscriminator = newError(6003, "WrongDiscriminator", "not a coordinator account")
	ErrWrongVersion       = newError(6004, "WrongVersion", "unsupported account version")
	ErrUnknownInstruction = newError(6005, "UnknownInstruction", "unknown instruction")

	// Who may do what.
	ErrUnauthorized         = newError(6010, "Unauthorized", "sender is not the run's main authority")
	ErrJoinNotAuthorized    = newError(6011, "JoinNotAuthorized", "the run's join authority did not co-sign")
	ErrSignerMismatch       = newError(6012, "SignerMismatch", "client signer is not the sender")
	ErrInvalidRunID         = newError(6013, "InvalidRunID", "run id must be 1 to 32 characters of [A-Za-z0-9._-]")
	ErrInvalidAuthority     = newError(6014, "InvalidAuthority", "main authority must not be the zero key")
	ErrAlreadyInitialized   = newError(6015, "AlreadyInitialized", "coordinator is already initialized")
	ErrInvalidClientID      = newError(6016, "InvalidClientID", "client signer and p2p identity must not be zero")
	ErrDuplicateP2PIdentity = newError(6017, "DuplicateP2PIdentity", "p2p identity is used by another pending client")

	// Run state.
	ErrHalted        = newError(6020, "Halted", "run is halted (uninitialized, paused or finished)")
	ErrWrongState    = newError(6021, "WrongState", "instruction is not allowed in the current run state")
	ErrFinished      = newError(6022, "Finished", "run is finished")
	ErrAlreadyPaused = newError(6023, "AlreadyPaused", "run is already paused or pausing")
	ErrNotPaused     = newError(6024, "NotPaused", "run is not paused")
	ErrNotHalted     = newError(6025, "NotHalted", "config, model and progress may change only while the run is halted")
	ErrNothingDue    = newError(6026, "NothingDue", "nothing is due: no timeout has passed and no condition is met")

	// Configuration.
	ErrInvalidConfig   = newError(6030, "InvalidConfig", "invalid config")
	ErrInvalidModel    = newError(6031, "InvalidModel", "invalid model")
	ErrInvalidProgress = newError(6032, "InvalidProgress", "invalid progress")

	// Membership.
	ErrPendingFull = newError(6040, "PendingFull", "no room for another client in the next epoch")
	ErrNotAClient  = newError(6041, "NotAClient", "sender is not a healthy client of the current epoch")

	// Witnesses and health.
	ErrInvalidProof     = newError(6050, "InvalidProof", "committee proof does not match the round")
	ErrNotAWitness      = newError(6051, "NotAWitness", "client is not a witness of this round")
	ErrDuplicateWitness = newError(6052, "DuplicateWitness", "witness already reported for this round")
	ErrWrongStep        = newError(6053, "WrongStep", "witness is for another step")
	ErrWitnessesFull    = newError(6054, "WitnessesFull", "round already has every witness")
	// ErrUnsupportedCommittee is no longer returned (every client trains);
	// its code stays reserved in the ABI.
	ErrUnsupportedCommittee = newError(6055, "UnsupportedCommittee", "verifier and tie-breaker committees are not supported")
	ErrClientHealthy        = newError(6060, "ClientHealthy", "client was seen by a quorum of witnesses")
	ErrClientNotHealthy     = newError(6061, "ClientNotHealthy", "client is no longer healthy")
	ErrNoPreviousRound      = newError(6062, "NoPreviousRound", "no finished round in this epoch to check health against")

	// Checkpoints.
	ErrNotCheckpointer     = newError(6070, "NotCheckpointer", "sender is not an elected checkpointer of this epoch")
	ErrAlreadyCheckpointed = newError(6071, "AlreadyCheckpointed", "a checkpoint was already recorded for this epoch")
	ErrInvalidCheckpoint   = newError(6072, "InvalidCheckpoint", "checkpoint source needs a URL")

	// Accounts of the on-chain program (the program's entrypoint returns
	// them; the state machine itself never does).
	ErrInstanceNotFunded = newError(6080, "InstanceNotFunded", "the instance account holds no lamports: fund it with the rent-exempt minimum for its 80 bytes in the init transaction")
)

// Errors returns every coordinator error, in code order.
func Errors() []*Error { return errorTable }

// ErrorFromCode returns the error with the given program error code, or nil.
func ErrorFromCode(code uint32) *Error {
	for _, e := range errorTable {
		if e.Code == code {
			return e
		}
	}
	return nil
}

// CodeOf returns the program error code of err (0 if it is not a coordinator error).
func CodeOf(err error) uint32 {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}
