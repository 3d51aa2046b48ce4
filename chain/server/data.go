package server

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/internal/connlimit"
)

// Defaults of the data server (WithData, WithDataLimits, WithDataReadTime).
const (
	DefaultMaxDataReads     = 256
	DefaultMaxDataReadsAddr = 16
	// A trainer reads one sequence a request (a few KiB): 10 s and
	// 64 KiB/s are far from what it needs, and what a reader that holds
	// its read open by reading slowly gets.
	DefaultDataReadTime = 10 * time.Second
	DefaultDataMinRate  = 64 << 10
)

// dataReadGrace is what a read may take beyond its bytes at the minimum
// rate (its first bytes, a slow start), within its deadline.
const dataReadGrace = 2 * time.Second

// dataRetryAfter is the Retry-After, in seconds, of a data read refused
// for its address's cap: a trainer's reader backs off and tries again.
const dataRetryAfter = 1

// dataServer serves a directory's files read-only at chain.ServerDataPath.
type dataServer struct {
	dir  string   // as given, for messages
	root *os.Root // every open goes through it: nothing outside dir, symbolic links included
	// reads bounds the reads in flight, per address group and in all: a
	// read holds a file and a goroutine, and an address's share of the
	// connections (WithMaxConnsPerAddr) is larger than a trainer needs.
	reads                *connlimit.Pool
	maxReads, maxPerAddr int
	readTime             time.Duration // a read's deadline (WithDataReadTime)
	minRate              int           // bytes/s a read must average after the grace
}

// WithData serves the regular files under dir read-only at /data/ (a run's
// data = "server:PATH" is dir/PATH): GET and HEAD with range requests,
// nothing else. A path with an empty, ".", ".." or hidden element is
// refused (400), and so is one that leaves dir through a symbolic link
// (404), as are directories (no listings). dir may not hold the server's
// state directory (its keys) nor lie inside it.
func WithData(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return errors.New("server: WithData: empty directory")
		}
		if c.data == nil {
			c.data = newDataServer()
		}
		c.data.dir = dir
		return nil
	}
}

func newDataServer() *dataServer {
	return &dataServer{maxReads: DefaultMaxDataReads, maxPerAddr: DefaultMaxDataReadsAddr,
		readTime: DefaultDataReadTime, minRate: DefaultDataMinRate}
}

// WithDataLimits caps the data reads in flight, in all and per address
// group (defaults DefaultMaxDataReads, DefaultMaxDataReadsAddr). A read
// past its group's cap is answered 429 with Retry-After. One past the
// total takes the place of a read that waits on its client (a slow or
// stalled reader) of the group that holds the most, if that group holds at
// least two more than the newcomer's (internal/connlimit's policy, the
// listeners' and the event streams'): the shed read's connection is
// closed, and its reader asks again. Failing that, 429.
func WithDataLimits(total, perAddr int) Option {
	return func(c *config) error {
		if total < 1 || perAddr < 1 {
			return fmt.Errorf("server: data read limits %d, %d must be at least 1", total, perAddr)
		}
		if c.data == nil {
			c.data = newDataServer()
		}
		c.data.maxReads, c.data.maxPerAddr = total, perAddr
		return nil
	}
}

// WithDataReadTime bounds each data read (defaults DefaultDataReadTime,
// DefaultDataMinRate): its whole response within d, and after a grace of
// 2 s (or d if shorter), at least minRate bytes a second on average. A read
// past either bound has its connection closed, so a reader that reads
// slowly holds its place for seconds, not for as long as it likes.
func WithDataReadTime(d time.Duration, minRate int) Option {
	return func(c *config) error {
		if d <= 0 || minRate < 1 {
			return fmt.Errorf("server: data read time %v and minimum rate %d B/s must be positive", d, minRate)
		}
		if c.data == nil {
			c.data = newDataServer()
		}
		c.data.readTime, c.data.minRate = d, minRate
		return nil
	}
}

// openData opens the data directory of cfg (if any) for a server whose
// state lives in stateDir.
func openData(d *dataServer, stateDir string) error {
	if d == nil {
		return nil
	}
	if d.dir == "" {
		return errors.New("server: WithDataLimits without WithData")
	}
	fi, err := os.Stat(d.dir)
	if err != nil {
		return fmt.Errorf("server: data directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("server: data directory %s is not a directory", d.dir)
	}
	dataAbs, err1 := realAbs(d.dir)
	stateAbs, err2 := realAbs(stateDir)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("server: data directory: %w", err)
	}
	if within(stateAbs, dataAbs) || within(dataAbs, stateAbs) {
		return fmt.Errorf("server: data directory %s and the state directory %s overlap: the state (the server's and the p2p host's keys, the runs) must not be served; give the data a directory of its own", d.dir, stateDir)
	}
	if d.root, err = os.OpenRoot(d.dir); err != nil {
		return fmt.Errorf("server: data directory: %w", err)
	}
	d.reads = connlimit.NewPool(d.maxReads, d.maxPerAddr, false)
	return nil
}

// realAbs is p absolute, with its symbolic links resolved.
func realAbs(p string) (string, error) {
	a, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(a)
}

// within says whether p is dir or under it.
func within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && filepath.IsLocal(rel) || rel == "."
}

// DataDir is the directory served at /data/ (WithData); empty if none.
func (s *Server) DataDir() string {
	if s.cfg.data == nil {
		return ""
	}
	return s.cfg.data.dir
}

// serveData answers a request for chain.ServerDataPath + name. The path is
// taken as the client sent it, before the mux cleans it (it would redirect
// "/data/../x" to "/x" rather than refuse it).
func (s *Server) serveData(w http.ResponseWriter, req *http.Request) {
	d := s.cfg.data
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "server: data is read-only: GET or HEAD", http.StatusMethodNotAllowed)
		return
	}
	name := strings.TrimPrefix(req.URL.Path, chain.ServerDataPath)
	if err := chain.ValidDataPath(name); err != nil {
		http.Error(w, "server: "+err.Error(), http.StatusBadRequest)
		return
	}
	r := &dataRead{ResponseWriter: w, rc: http.NewResponseController(w), start: time.Now(), d: d}
	r.slot = d.reads.Acquire(connlimit.GroupOf(req.RemoteAddr), false, r.shed)
	if r.slot == nil {
		w.Header().Set("Retry-After", fmt.Sprint(dataRetryAfter))
		http.Error(w, "server: too many data reads from this address at once", http.StatusTooManyRequests)
		return
	}
	defer r.end()
	r.setDeadline()
	f, err := d.open(filepath.FromSlash(name))
	if err != nil {
		// Missing, unreadable, not a regular file, or a symbolic link out
		// of the directory: all look the same from outside.
		s.cfg.log.Debug("data file refused", "path", name, "err", err)
		http.Error(w, "server: no such data file", http.StatusNotFound)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, "server: no such data file", http.StatusNotFound)
		return
	}
	// Token files are read in ranges: a compressing proxy must not touch
	// them, and a browser should ask again rather than cache stale bytes.
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(r, req, fi.Name(), fi.ModTime(), f)
}

// errNotRegular is a data path that names something other than a regular
// file.
var errNotRegular = errors.New("not a regular file")

// open opens a regular file of the directory without blocking: it is
// looked at before it is opened, so a FIFO (whose open waits for a writer)
// or a device is never opened, and opened non-blocking and looked at again,
// in case it was replaced in between.
func (d *dataServer) open(name string) (*os.File, error) {
	fi, err := d.root.Stat(name)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errNotRegular
	}
	// O_NONBLOCK changes nothing for a regular file's reads.
	f, err := d.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if fi, err = f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, errors.Join(err, errNotRegular)
	}
	return f, nil
}

// dataRead is one data read in flight: it writes the response under the
// read's deadline, which grows with the bytes written at the minimum rate
// (WithDataReadTime), and may be shed (connlimit) once it has begun to
// answer. The pool sheds the oldest such read of the heaviest group: the
// one that has waited on its client longest (a trainer's read of one
// sequence is over in milliseconds; a reader that holds its read open by
// reading slowly is the one that goes).
type dataRead struct {
	http.ResponseWriter
	rc      *http.ResponseController
	d       *dataServer
	slot    *connlimit.Slot
	start   time.Time
	written int64
	begun   bool // a write was made: the slot is sheddable

	mu sync.Mutex
	// over: the handler has returned (the connection may carry another
	// request now) or the read was shed; either way its deadline is not
	// touched any more.
	over bool
}

// Unwrap lets http.ResponseController reach the connection.
func (r *dataRead) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *dataRead) Write(p []byte) (int, error) {
	r.written += int64(len(p))
	if !r.setDeadline() {
		return 0, errDataShed
	}
	if !r.begun {
		r.begun = true
		r.slot.SetSheddable(true)
	}
	return r.ResponseWriter.Write(p)
}

// errDataShed is the write of a read the pool shed.
var errDataShed = errors.New("server: data read shed for another address's")

// setDeadline sets the connection's write deadline for the bytes written
// so far, and says whether the read may go on (it was not shed).
func (r *dataRead) setDeadline() bool {
	d := r.d
	grace := min(dataReadGrace, d.readTime)
	at := r.start.Add(min(d.readTime, grace+time.Duration(float64(r.written)/float64(d.minRate)*float64(time.Second))))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over {
		return false
	}
	_ = r.rc.SetWriteDeadline(at)
	return true
}

// shed ends the read for a newcomer of a lighter address group: its write
// deadline passes at once, so the write it waits in fails and the
// connection is closed.
func (r *dataRead) shed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over {
		return
	}
	r.over = true
	_ = r.rc.SetWriteDeadline(time.Unix(1, 0))
}

// end gives the read's place back once the handler is done.
func (r *dataRead) end() {
	r.mu.Lock()
	r.over = true
	r.mu.Unlock()
	r.slot.Release()
}

// isDataPath says whether a request is for the data server: its path as
// sent or as decoded starts with chain.ServerDataPath.
func isDataPath(req *http.Request) bool {
	return strings.HasPrefix(req.URL.Path, chain.ServerDataPath) || strings.HasPrefix(req.URL.EscapedPath(), chain.ServerDataPath)
}
