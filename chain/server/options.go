package server

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/psyche-go/psyche/coordinator"
)

type config struct {
	p2p      P2P
	log      *slog.Logger
	interval time.Duration
	manual   bool // Serve never ticks: the owner calls Tick
	now      func() time.Time
	seed     func(*coordinator.Coordinator) uint64 // a run's state -> the seed its next instruction may start a round with
	metrics  *Metrics

	window     time.Duration                   // requests are valid this long either side of the wall clock
	anyCreator bool                            // any key may create runs (creators ignored)
	creators   map[coordinator.Pubkey]struct{} // who may create runs otherwise
	quota      int                             // live runs per main authority

	maxSubs, maxSubsPerAddr int
	slowWrite               time.Duration // an event write that takes longer drops the stream

	readTimeout, writeTimeout, idleTimeout time.Duration
	maxConns, maxConnsPerAddr              int             // WithMaxConns, WithMaxConnsPerAddr
	onFree                                 func(id string) // WithOnFree (nil: nothing to do)

	routes []func(*http.ServeMux) // more endpoints (WithRoutes)
	page   http.Handler           // WithPage (explorer.go)
	data   *dataServer            // WithData (data.go)
}

// Option configures a Server.
type Option func(*config) error

// Defaults (see the options that change them).
const (
	DefaultRequestWindow      = 5 * time.Minute
	DefaultCreatorQuota       = 16
	DefaultMaxSubscribers     = 1024
	DefaultMaxSubscribersAddr = 64
	DefaultSlowSubscriber     = 10 * time.Second
	DefaultReadTimeout        = 30 * time.Second
	DefaultWriteTimeout       = 30 * time.Second
	DefaultIdleTimeout        = 2 * time.Minute
	DefaultMaxConns           = 4096
	DefaultMaxConnsPerAddr    = 256
)

// WithCreators lets only these keys create runs (none: nobody may). Without
// it or WithAnyCreator, any key may: the library's default suits an
// embedded server that only its own process reaches (psyche localnet); the
// psyche server command defaults to its operator's key.
func WithCreators(keys ...coordinator.Pubkey) Option {
	return func(c *config) error {
		c.anyCreator = false
		c.creators = make(map[coordinator.Pubkey]struct{}, len(keys))
		for _, k := range keys {
			c.creators[k] = struct{}{}
		}
		return nil
	}
}

// WithAnyCreator lets any key create runs (each still within its quota).
func WithAnyCreator() Option {
	return func(c *config) error { c.anyCreator, c.creators = true, nil; return nil }
}

// WithCreatorQuota sets how many live runs one main authority may hold
// (default DefaultCreatorQuota). Freeing a run gives its place back.
func WithCreatorQuota(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("server: creator quota %d must be at least 1", n)
		}
		c.quota = n
		return nil
	}
}

// WithRequestWindow sets how far from the server's wall clock a request's
// sequence (nanoseconds) may be (default DefaultRequestWindow): a request
// older than that is refused as stale, so a captured one that was refused
// cannot be replayed later.
func WithRequestWindow(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("server: request window %v must be positive", d)
		}
		c.window = d
		return nil
	}
}

// WithSubscriberLimits caps the open event streams, in all and per remote
// address group (an IPv4 address, an IPv6 /64: internal/connlimit.Group;
// defaults DefaultMaxSubscribers, DefaultMaxSubscribersAddr). A stream over
// its group's cap is refused with 429 (and Retry-After); one over the total
// takes the place of the oldest stream of the group that holds the most, if
// that group holds at least two more than its own, and is refused
// otherwise. A client refused a stream polls the run instead (serverclient.Client).
func WithSubscriberLimits(total, perAddr int) Option {
	return func(c *config) error {
		if total < 1 || perAddr < 1 {
			return fmt.Errorf("server: subscriber limits %d, %d must be at least 1", total, perAddr)
		}
		c.maxSubs, c.maxSubsPerAddr = total, perAddr
		return nil
	}
}

// WithSlowSubscriber sets how long writing one event to a stream may take
// before the stream is dropped (default DefaultSlowSubscriber): a client
// that stops reading fills its socket buffers and is then cut off instead
// of holding memory and a goroutine forever.
func WithSlowSubscriber(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("server: slow subscriber timeout %v must be positive", d)
		}
		c.slowWrite = d
		return nil
	}
}

// WithHTTPTimeouts sets the HTTP server's read, write and idle timeouts
// (defaults DefaultReadTimeout, DefaultWriteTimeout, DefaultIdleTimeout).
// Event streams are exempt from the read and write timeouts: they live as
// long as their client reads, each event bounded by WithSlowSubscriber.
func WithHTTPTimeouts(read, write, idle time.Duration) Option {
	return func(c *config) error {
		if read <= 0 || write <= 0 || idle <= 0 {
			return fmt.Errorf("server: HTTP timeouts %v, %v, %v must be positive", read, write, idle)
		}
		c.readTimeout, c.writeTimeout, c.idleTimeout = read, write, idle
		return nil
	}
}

// WithMaxConns caps the HTTP connections open at once (default
// DefaultMaxConns), so strangers cannot hold a goroutine and buffers each
// without bound. Past it, a new connection takes the place of an idle one
// (or one that has not sent a whole request yet) of the address group that
// holds the most, if it holds at least two more than the newcomer's;
// otherwise the new one is closed at once (internal/httpserve).
func WithMaxConns(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("server: connection cap %d must be positive", n)
		}
		c.maxConns = n
		return nil
	}
}

// WithMaxConnsPerAddr caps the HTTP connections of one address group (an
// IPv4 address, an IPv6 /64) (default DefaultMaxConnsPerAddr: 64 trainers
// behind one NAT, each with its stream and a few keep-alive connections).
// Past it, a new connection from the group takes the place of the group's
// connection idle the longest, or is closed when none is idle.
func WithMaxConnsPerAddr(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("server: per-address connection cap %d must be positive", n)
		}
		c.maxConnsPerAddr = n
		return nil
	}
}

// WithOnFree sets a function called with a run's id once the run is freed
// (after its tombstone is written): where other services keep state beside
// the run (the federated service), this is when it goes.
func WithOnFree(f func(id string)) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("server: WithOnFree: nil function")
		}
		c.onFree = f
		return nil
	}
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("server: nil logger")
		}
		c.log = l
		return nil
	}
}

// WithTickInterval sets the longest Serve waits between ticks (default 1s).
// Serve also ticks when a run's next transition falls due (the second its
// timeout ends, coordinator.DueAt) and after every instruction that changed a
// run, so a transition never waits for the interval.
func WithTickInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("server: tick interval %v must be positive", d)
		}
		c.interval = d
		return nil
	}
}

// WithManualTicks makes Serve never tick by itself: the owner calls Tick
// (a virtual clock that ticks when it moves, a test that must see exactly
// the acknowledged state).
func WithManualTicks() Option {
	return func(c *config) error { c.manual = true; return nil }
}

// WithRoutes adds HTTP routes to the server's API (federated runs'
// service, federated/fedserver, mounts itself this way).
func WithRoutes(add func(*http.ServeMux)) Option {
	return func(c *config) error { c.routes = append(c.routes, add); return nil }
}

// WithClock replaces the wall clock (tests).
func WithClock(now func() time.Time) Option {
	return func(c *config) error { c.now = now; return nil }
}

// WithSeeds replaces the random round seeds (tests).
func WithSeeds(seed func() uint64) Option {
	return func(c *config) error { c.seed = func(*coordinator.Coordinator) uint64 { return seed() }; return nil }
}

// WithStateSeeds draws each instruction's round seed from the run's state
// it applies to. A seed that is a function of the state (say, of its epoch,
// step and phase) makes a run reproducible: the round that an instruction
// starts gets the same seed whichever instruction happens to start it, and
// however many came before (localnet --virtual-time). Predictable seeds let
// trainers know their batches early, so this is for runs that trust them.
func WithStateSeeds(seed func(s *coordinator.Coordinator) uint64) Option {
	return func(c *config) error { c.seed = seed; return nil }
}

func randomSeed(*coordinator.Coordinator) uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return binary.LittleEndian.Uint64(b[:])
}

// P2P is the libp2p host a server runs beside its runs (p2p/libp2p's
// Bootstrap): trainers bootstrap their run's DHT from it and, if it relays,
// reach each other through it. The server publishes its addresses and tells
// it which runs exist and who their members are.
type P2P interface {
	Addrs() []string
	Relay() bool
	// SetRuns is called with every run and the p2p keys of its members
	// (clients, joiners and the exited list: setMembers) whenever they
	// change.
	SetRuns(runs map[string][]coordinator.Pubkey)
}

// WithP2P runs p beside the runs (see P2P).
func WithP2P(p P2P) Option {
	return func(c *config) error { c.p2p = p; return nil }
}
