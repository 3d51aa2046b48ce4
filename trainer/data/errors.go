package data

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors that callers may need to branch on; test with errors.Is.
// Returned errors wrap them with the details (path, URL, offsets, sizes).
var (
	// ErrNotFound: the local file or the remote object does not exist (HTTP
	// 404 or 410). Never retried.
	ErrNotFound = errors.New("data: not found")
	// ErrRangeIgnored: the HTTP server answered a range request with the
	// whole file (status 200), so it cannot serve single sequences.
	ErrRangeIgnored = errors.New("data: server ignores Range requests")
	// ErrShortRead: the file ends before the bytes that were asked for, or a
	// response body ended early.
	ErrShortRead = errors.New("data: short read")
	// ErrChanged: the remote file's size changed while it was being read, so
	// sequences read before and after would not belong to one data set.
	ErrChanged = errors.New("data: remote file changed")
	// ErrMisaligned: a size is not a multiple of the token size.
	ErrMisaligned = errors.New("data: size is not a multiple of the token size")
	// ErrTooShort: the token file does not hold even one sequence.
	ErrTooShort = errors.New("data: too few tokens for one sequence")
	// ErrTokenRange: a token does not fit the token width or the vocabulary.
	ErrTokenRange = errors.New("data: token out of range")
)

// contextError adds context to an error while keeping one "data: " prefix:
// wrapping "data: short read: …" in "reading sequence 3" reads
// "data: reading sequence 3: short read: …".
type contextError struct {
	context string
	err     error
}

func (e *contextError) Error() string {
	return "data: " + e.context + ": " + strings.TrimPrefix(e.err.Error(), "data: ")
}

func (e *contextError) Unwrap() error { return e.err }

// wrapf returns err with the context format, args prepended.
func wrapf(err error, format string, args ...any) error {
	return &contextError{context: fmt.Sprintf(format, args...), err: err}
}
