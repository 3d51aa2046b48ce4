package explorer

import (
	"context"
	"embed"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/connlimit"
	"github.com/psyche-go/psyche/internal/httpserve"
)

// The page, built by `npm run build` in web/ (esbuild bundles web/src and
// uPlot into web/dist). The built files are committed, so building the Go
// binary needs no Node; scripts/test checks that they match a fresh build.
//
//go:embed web/dist
var dist embed.FS

// keepAlive is how often an idle event stream sends the run's clock (the
// page's timers count from it, and proxies see traffic).
const keepAlive = 5 * time.Second

// Stream limits: a browser tab holds one or two streams; these bound what
// anonymous clients can hold open (each costs a goroutine and buffers), and
// a stream whose client does not take an event within slowWrite is dropped.
// An address is an address group (an IPv4 address, an IPv6 /64:
// internal/connlimit); past the total, a new stream takes the place of the
// oldest of the group that holds the most, if it holds at least two more
// than the newcomer's (the page reconnects).
const (
	maxStreams        = 1024
	maxStreamsPerAddr = 64
	slowWrite         = 10 * time.Second
)

// ServeLimits are the limits of psyche explorer's listener: the public
// listeners' timeouts (10 s for headers, 2 min idle: httpserve.Defaults) and
// twice as many connections as streams, 2,048 and 128 per address. A stream
// holds its connection for as long as it lasts, so with as many connections
// as streams 16 addresses' streams filled the listener, and a fresh client
// found no connection on which to ask for the stream that shedding would
// have made room for.
var ServeLimits = func() httpserve.Limits {
	l := httpserve.Defaults
	l.MaxConns, l.MaxConnsPerAddr = 2*maxStreams, 2*maxStreamsPerAddr
	return l
}()

// streamLimit counts open event streams, in all and per address group.
type streamLimit struct{ pool *connlimit.Pool }

func newStreamLimit() *streamLimit {
	return &streamLimit{pool: connlimit.NewPool(maxStreams, maxStreamsPerAddr, false)}
}

// acquire takes a stream for the client at remote (RemoteAddr), or refuses
// (false). shed is called if the stream is later closed for a newcomer.
func (l *streamLimit) acquire(remote string, shed func()) (release func(), ok bool) {
	s := l.pool.Acquire(connlimit.GroupOf(remote), true, shed)
	if s == nil {
		return nil, false
	}
	return s.Release, true
}

// limited wraps an event-stream handler with the stream limits: over them,
// 429 with the reason (the page reconnects later); a stream shed for
// another address's ends as if its client had gone.
func (l *streamLimit) limited(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		release, ok := l.acquire(r.RemoteAddr, cancel)
		if !ok {
			w.Header().Set("Retry-After", "10")
			httpserve.WriteJSON(w, http.StatusTooManyRequests, errorBody{Error: "too many open event streams; try again later"})
			return
		}
		defer release()
		h(w, r.WithContext(ctx))
	}
}

// Handler serves the page and its API (see the package comment). Every
// route is a GET that only reads: nothing a request carries changes what
// the explorer shows or reaches the backend.
func (e *Explorer) Handler() http.Handler {
	mux := http.NewServeMux()
	lim := newStreamLimit()
	static, err := fs.Sub(dist, "web/dist")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(static)
	mux.Handle("GET /", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /api/runs", func(w http.ResponseWriter, _ *http.Request) { httpserve.WriteJSON(w, http.StatusOK, e.list()) })
	mux.HandleFunc("GET /api/runs/events", lim.limited(func(w http.ResponseWriter, r *http.Request) {
		ch, cancel := e.watchList()
		defer cancel()
		stream(w, r, ch, func() (any, bool) { return e.list(), true }, e.clock)
	}))
	mux.HandleFunc("GET /api/runs/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, u, ok := e.knownRun(w, r)
		if !ok {
			return
		}
		httpserve.WriteJSON(w, http.StatusOK, u)
	})
	mux.HandleFunc("GET /api/runs/{id}/history.csv", func(w http.ResponseWriter, r *http.Request) {
		id, u, ok := e.knownRun(w, r)
		if !ok {
			return
		}
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", id+"-history.csv"))
		_ = WriteHistoryCSV(w, u.Points)
	})
	mux.HandleFunc("GET /api/runs/{id}/events", lim.limited(func(w http.ResponseWriter, r *http.Request) {
		id, _, ok := e.knownRun(w, r)
		if !ok {
			return
		}
		ch, cancel, ok := e.watchRun(id)
		if !ok {
			notFound(w, id)
			return
		}
		defer cancel()
		var rev uint64
		stream(w, r, ch, func() (any, bool) {
			u, next, ok := e.update(id, rev)
			if !ok || (next == rev && rev != 0) {
				return nil, ok
			}
			rev = next
			return u, true
		}, e.clock)
	}))
	return mux
}

func (e *Explorer) clock() int64 { return e.cfg.now().Unix() }

// knownRun is the run the path names and its update, or false once it has
// answered 400 (not a run id) or 404 (no such run here).
func (e *Explorer) knownRun(w http.ResponseWriter, r *http.Request) (string, Update, bool) {
	id, ok := runID(w, r)
	if !ok {
		return "", Update{}, false
	}
	u, _, ok := e.update(id, 0)
	if !ok {
		notFound(w, id)
		return "", Update{}, false
	}
	return id, u, true
}

// runID checks the path's run id: the same rule as the coordinator's.
func runID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if _, err := coordinator.ParseRunID(id); err != nil {
		httpserve.WriteJSON(w, http.StatusBadRequest, errorBody{Error: fmt.Sprintf("%q is not a run id: %v", id, err)})
		return "", false
	}
	return id, true
}

type errorBody struct {
	Error string `json:"error"`
}

func notFound(w http.ResponseWriter, id string) {
	httpserve.WriteJSON(w, http.StatusNotFound, errorBody{Error: fmt.Sprintf("no run %q on this backend", id)})
}

// stream sends next() as a server-sent event at once and after every wake
// on ch, and the clock every keepAlive, until the client goes or next says
// the thing is gone. next returns nil to send nothing this time.
func stream(w http.ResponseWriter, r *http.Request, ch <-chan struct{}, next func() (any, bool), clock func() int64) {
	if _, ok := w.(http.Flusher); !ok {
		httpserve.WriteJSON(w, http.StatusInternalServerError, errorBody{Error: "streaming is not supported here"})
		return
	}
	// A client that does not take an event within slowWrite is dropped.
	events := httpserve.StartEvents(w, slowWrite)
	send := func() bool {
		v, ok := next()
		if !ok {
			return false
		}
		if v == nil {
			return true
		}
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		return events.Send(fmt.Appendf(nil, "data: %s\n\n", b)) == nil
	}
	if !send() {
		return
	}
	t := time.NewTicker(keepAlive)
	defer t.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ch:
			if !send() {
				return
			}
		case <-t.C:
			if events.Send(fmt.Appendf(nil, "event: clock\ndata: %d\n\n", clock())) != nil {
				return
			}
		}
	}
}

// WriteHistoryCSV writes points as CSV with a header line: step, epoch,
// loss, held_out, tokens_per_sec, bytes_sent, witnesses, quorum, trainers;
// a value not measured at a step is an empty field.
func WriteHistoryCSV(w io.Writer, points []Point) error {
	cw := csv.NewWriter(w)
	opt := func(v *float64) string {
		if v == nil {
			return ""
		}
		return strconv.FormatFloat(*v, 'g', -1, 64)
	}
	_ = cw.Write([]string{"step", "epoch", "loss", "held_out", "tokens_per_sec", "bytes_sent", "witnesses", "quorum", "trainers"})
	for _, p := range points {
		_ = cw.Write([]string{strconv.FormatUint(uint64(p.Step), 10), strconv.FormatUint(uint64(p.Epoch), 10),
			opt(p.Loss), opt(p.HeldOut), opt(p.TokensPerSec), opt(p.BytesSent),
			strconv.Itoa(p.Witnesses), strconv.Itoa(p.Quorum), strconv.Itoa(p.Trainers)})
	}
	cw.Flush()
	return cw.Error()
}
