package httpserve

import (
	"net/http"
	"time"
)

// Events is one server-sent event stream (text/event-stream) being
// written. A stream outlives the server's WriteTimeout, which would cut it
// off mid-run: each write gets a deadline of its own instead, and a client
// that does not take an event within it is gone (the write fails).
type Events struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	slow time.Duration
}

// StartEvents answers 200 with an event stream's headers: no caching, and
// no buffering by a proxy in front (an event held back is a late event),
// and sends them.
// slow bounds each write. A writer that cannot flush or set deadlines (a
// test's recorder) gets neither, and Send reports the flush it could not
// do.
func StartEvents(w http.ResponseWriter, slow time.Duration) *Events {
	e := &Events{w: w, rc: http.NewResponseController(w), slow: slow}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	e.deadline()
	w.WriteHeader(http.StatusOK)
	// The headers go now: the client learns the stream is open before the
	// first event, which may be a while.
	_ = e.rc.Flush()
	return e
}

func (e *Events) deadline() { _ = e.rc.SetWriteDeadline(time.Now().Add(e.slow)) }

// Send writes b, whole events in the stream's format, and flushes them to
// the client. An error (os.ErrDeadlineExceeded for a client too slow to
// take them) ends the stream.
func (e *Events) Send(b []byte) error {
	e.deadline()
	if _, err := e.w.Write(b); err != nil {
		return err
	}
	return e.rc.Flush()
}
