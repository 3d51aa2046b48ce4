package server

import (
	"encoding/base64"
)

// The event stream's format (whole accounts and deltas) is serverwire's
// (delta.go): the client reads what this file writes.

// event is one change of a run, for every subscriber: the account's bytes
// (immutable once made) and its whole-account event, encoded once.
type event struct {
	acct []byte
	full []byte
}

func newEvent(acct []byte) *event {
	ev := make([]byte, 0, 8+base64.StdEncoding.EncodedLen(len(acct)))
	ev = append(ev, "data: "...)
	ev = base64.StdEncoding.AppendEncode(ev, acct)
	return &event{acct: acct, full: append(ev, "\n\n"...)}
}
