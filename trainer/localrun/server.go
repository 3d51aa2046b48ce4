package localrun

import (
	"context"
	"net"
	"path/filepath"
	"time"

	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/internal/quietclock"
)

// Server is the embedded server serving on 127.0.0.1 and a client of it.
type Server struct {
	Server *server.Server
	Client *serverclient.Client
	URL    string            // where it serves: http://127.0.0.1:port
	Clock  *quietclock.Clock // WithClock's (nil: the wall clock)
	done   chan struct{}
	err    error
}

// StartServer starts the embedded server, its state in dir/server, until
// ctx ends (Wait). Options: WithLogger, WithClock, WithServerOptions. On
// the wall clock the server ticks when a transition falls due; in virtual
// time it ticks when the clock moves, never by itself, so that nothing
// happens between two moves of the clock.
func StartServer(ctx context.Context, dir string, opts ...Option) (*Server, error) {
	o := newOptions(opts)
	var sopts []server.Option
	if o.log != nil {
		sopts = append(sopts, server.WithLogger(o.log))
	}
	if o.clock != nil {
		sopts = append(sopts, server.WithManualTicks(), server.WithClock(o.clock.Now))
	}
	srv, err := server.New(filepath.Join(dir, "server"), append(sopts, o.serverOpts...)...)
	if err != nil {
		return nil, err
	}
	if o.clock != nil {
		o.clock.OnAdvance(func(time.Time) { srv.Tick() })
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{Server: srv, URL: "http://" + l.Addr().String(), Clock: o.clock, done: make(chan struct{})}
	s.Client = serverclient.New(s.URL, o.log)
	go func() { s.err = srv.Serve(ctx, l); close(s.done) }()
	return s, nil
}

// Wait waits for the server to stop and returns its result.
func (s *Server) Wait() error {
	<-s.done
	return s.err
}
