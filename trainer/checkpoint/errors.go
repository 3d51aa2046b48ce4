package checkpoint

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error returned by this package starts with
// "checkpoint: " and wraps at most a few of these, so callers branch with
// errors.Is and people read the detail in the message.
var (
	// ErrMalformed is wrapped by every error that rejects the bytes of a
	// checkpoint, whatever the reason.
	ErrMalformed = errors.New("checkpoint: malformed checkpoint")
	// ErrTruncated means the input ended before the header or the data it
	// announces: fetching it again may help.
	ErrTruncated = errors.New("checkpoint: truncated checkpoint")
	// ErrTooLarge means the header or the data exceeds a Limits cap (or, on
	// write, the header exceeds DefaultMaxHeaderSize and no reader with the
	// default limits could load it).
	ErrTooLarge = errors.New("checkpoint: checkpoint too large")
	// ErrUnsupportedDType means a tensor has a dtype other than F32, F16 or
	// BF16.
	ErrUnsupportedDType = errors.New("checkpoint: unsupported dtype")

	// ErrInvalidTensor means Save, Write or Encode was given a tensor list
	// that cannot be written (bad name, bad shape, duplicate).
	ErrInvalidTensor = errors.New("checkpoint: invalid tensor")
	// ErrInvalidMetadata means a metadata key or value cannot be written
	// (it is not valid UTF-8).
	ErrInvalidMetadata = errors.New("checkpoint: invalid metadata")

	// ErrNotFound means a checkpoint has no tensor of the requested name.
	ErrNotFound = errors.New("checkpoint: tensor not found")
	// ErrShapeMismatch means a tensor exists but has another shape than the
	// one requested.
	ErrShapeMismatch = errors.New("checkpoint: tensor shape mismatch")

	// ErrNoModelConfig means the metadata has no ModelKey entry.
	ErrNoModelConfig = errors.New("checkpoint: no model config in metadata")
	// ErrInvalidModelConfig means a model config is unreadable or describes
	// no valid model.
	ErrInvalidModelConfig = errors.New("checkpoint: invalid model config")
)

// formatError rejects input bytes. Its message is the kind's message plus a
// detail; it matches both its kind and ErrMalformed under errors.Is.
type formatError struct {
	kind   error
	detail string
}

func (e *formatError) Error() string { return e.kind.Error() + ": " + e.detail }

func (e *formatError) Unwrap() []error {
	if e.kind == ErrMalformed {
		return []error{ErrMalformed}
	}
	return []error{e.kind, ErrMalformed}
}

func malformed(format string, args ...any) error {
	return &formatError{kind: ErrMalformed, detail: fmt.Sprintf(format, args...)}
}

func formatErr(kind error, format string, args ...any) error {
	return &formatError{kind: kind, detail: fmt.Sprintf(format, args...)}
}

// wrap prefixes err with a sentinel's message and detail, keeping both in
// the errors.Is chain.
func wrap(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}
