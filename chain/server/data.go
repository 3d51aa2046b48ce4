package server

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/internal/connlimit"
)

// Defaults of the data server (WithData, WithDataLimits).
const (
	DefaultMaxDataReads     = 256
	DefaultMaxDataReadsAddr = 16
)

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
			c.data = &dataServer{maxReads: DefaultMaxDataReads, maxPerAddr: DefaultMaxDataReadsAddr}
		}
		c.data.dir = dir
		return nil
	}
}

// WithDataLimits caps the data reads in flight, in all and per address
// group (defaults DefaultMaxDataReads, DefaultMaxDataReadsAddr); a read past
// a cap is answered 429 with Retry-After.
func WithDataLimits(total, perAddr int) Option {
	return func(c *config) error {
		if total < 1 || perAddr < 1 {
			return fmt.Errorf("server: data read limits %d, %d must be at least 1", total, perAddr)
		}
		if c.data == nil {
			c.data = &dataServer{}
		}
		c.data.maxReads, c.data.maxPerAddr = total, perAddr
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
	slot := d.reads.Acquire(connlimit.GroupOf(req.RemoteAddr), false, nil)
	if slot == nil {
		w.Header().Set("Retry-After", fmt.Sprint(dataRetryAfter))
		http.Error(w, "server: too many data reads from this address at once", http.StatusTooManyRequests)
		return
	}
	defer slot.Release()
	f, err := d.root.Open(filepath.FromSlash(name))
	if err != nil {
		// Missing, unreadable, or a symbolic link out of the directory:
		// all look the same from outside.
		s.cfg.log.Debug("data file refused", "path", name, "err", err)
		http.Error(w, "server: no such data file", http.StatusNotFound)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.Error(w, "server: no such data file", http.StatusNotFound)
		return
	}
	// Token files are read in ranges: a compressing proxy must not touch
	// them, and a browser should ask again rather than cache stale bytes.
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, req, fi.Name(), fi.ModTime(), f)
}

// isDataPath says whether a request is for the data server: its path as
// sent or as decoded starts with chain.ServerDataPath.
func isDataPath(req *http.Request) bool {
	return strings.HasPrefix(req.URL.Path, chain.ServerDataPath) || strings.HasPrefix(req.URL.EscapedPath(), chain.ServerDataPath)
}
