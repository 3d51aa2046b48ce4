package libp2p

import (
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// Option configures a Node.
type Option func(*config) error

type config struct {
	runID        *string
	listen       []string
	key          ed25519.PrivateKey
	keyFile      string
	bootstrap    []string
	relays       []string
	mdns         bool
	allowAll     bool
	logger       *slog.Logger
	reannounce   time.Duration
	fetchTimeout time.Duration
	fetchRetries int
	minRate      int64                           // WithMinFetchRate, bytes per second
	stallTimeout time.Duration                   // WithMinFetchRate
	clock        clock                           // the blob stream's stall timer (tests control it)
	serveHook    func(i int, h coordinator.Hash) // tests: called before serving each streamed block
	noStream     bool                            // benchmarks: fetch with bitswap alone
	readHook     func(block int)                 // tests: called before reading each streamed block
	// streamPeers bounds the peers other than the announcer that one fetch
	// streams from before it leaves the rest to bitswap: a peer that does
	// not hold the blob answers at once, but costs a round trip.
	streamPeers     int
	retryBackoff    time.Duration
	ckptConcurrency int
	ckptProgress    func(done, total int)
	relayService    bool
	idleTimeout     time.Duration // WithIdleTimeout (a Bootstrap host's)
	connsPerAddr    int           // WithConnLimits (a Bootstrap host's); 0: from the reservations
	connsTotal      int
	// limitLoopback applies a Bootstrap host's per-address connection cap to
	// loopback addresses too, which libp2p exempts: only for tests, which
	// have no other address to flood from.
	limitLoopback bool
	openRelay     bool
	// WithRelayReservations (0: the defaults)
	relayReservations, relayReservationsPerIP int
	signer                                    coordinator.Pubkey
	metrics                                   *Metrics
	set                                       map[string]bool
}

func (c *config) once(name string) error {
	if c.set[name] {
		return fmt.Errorf("%w: %s", p2p.ErrOptionSet, name)
	}
	c.set[name] = true
	return nil
}

// WithRunID sets the run whose topic the node joins (required, ≤ 32 bytes).
func WithRunID(id string) Option {
	return func(c *config) error {
		if len(id) == 0 || len(id) > coordinator.MaxRunIDLen {
			return fmt.Errorf("%w: run id of %d bytes", p2p.ErrConfig, len(id))
		}
		c.runID = &id
		return c.once("run id")
	}
}

// WithListenAddrs sets the multiaddrs to listen on. Default: TCP and QUIC on
// every interface, ports chosen by the system. None at all makes a node that
// only dials out (reachable through a relay, if it has one).
func WithListenAddrs(addrs ...string) Option {
	return func(c *config) error {
		c.listen = append([]string{}, addrs...) // never nil: none at all is a choice
		return c.once("listen addresses")
	}
}

// WithKey sets the node's ed25519 identity.
func WithKey(key ed25519.PrivateKey) Option {
	return func(c *config) error {
		if len(key) != ed25519.PrivateKeySize {
			return fmt.Errorf("%w: ed25519 key of %d bytes", p2p.ErrConfig, len(key))
		}
		c.key = key
		return c.once("key")
	}
}

// WithKeyFile loads the identity from path, creating and saving a fresh one
// if the file does not exist (see LoadOrCreateKey).
func WithKeyFile(path string) Option {
	return func(c *config) error {
		c.keyFile = path
		return c.once("key")
	}
}

// WithBootstrapPeers adds peers (multiaddrs ending in /p2p/<id>) that are
// dialled until reached, bootstrap the run's DHT and are always allowed
// through the gater, whatever the epoch. An address that does not parse is
// logged by name and skipped.
func WithBootstrapPeers(addrs ...string) Option {
	return func(c *config) error {
		c.bootstrap = append(c.bootstrap, addrs...)
		return nil
	}
}

// WithRelays sets circuit relay v2 servers (multiaddrs ending in
// /p2p/<id>): while the node is not known to be publicly reachable it keeps
// a reservation on them, so that peers can reach it through the relay until
// hole punching gives them a direct connection. Relays are always allowed
// through the gater, and also bootstrap the DHT.
func WithRelays(addrs ...string) Option {
	return func(c *config) error {
		c.relays = append(c.relays, addrs...)
		return nil
	}
}

// WithMDNS turns on mDNS discovery of the run's peers on the local network.
func WithMDNS() Option {
	return func(c *config) error {
		c.mdns = true
		return c.once("mdns")
	}
}

// WithRelayService makes a Bootstrap host a circuit relay v2 server for the
// trainers of its runs (see NewBootstrap).
func WithRelayService() Option {
	return func(c *config) error {
		c.relayService = true
		return c.once("relay service")
	}
}

// WithOpenRelay makes a Bootstrap host a circuit relay for anyone, within
// the relay's reservation and circuit counts, whatever runs it is told
// about: for psyche relay, which does not follow the runs' state, so cannot
// know their members. A server's relay (WithRelayService) serves only its
// runs' members.
func WithOpenRelay() Option {
	return func(c *config) error {
		c.openRelay = true
		return c.once("open relay")
	}
}

// WithRelayReservations bounds a relay's reservations: total in all, perIP
// from one IP address (defaults 4,096 and 256). It is how an open relay's
// operator limits who it serves (WithOpenRelay).
func WithRelayReservations(total, perIP int) Option {
	return func(c *config) error {
		if total <= 0 || perIP <= 0 {
			return fmt.Errorf("%w: relay reservations %d, %d per IP", p2p.ErrConfig, total, perIP)
		}
		c.relayReservations, c.relayReservationsPerIP = total, perIP
		return c.once("relay reservations")
	}
}

// WithIdleTimeout sets how long a Bootstrap host keeps a connection that
// carries no stream, holds no relay reservation and belongs to none of its
// runs' members (default 5 minutes): a
// peer that only holds connections open costs the host a slot of its
// per-address and total caps for at most this long. Peers that use the host
// (a DHT query, a circuit, a reservation) keep theirs.
func WithIdleTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: idle timeout %v", p2p.ErrConfig, d)
		}
		c.idleTimeout = d
		return c.once("idle timeout")
	}
}

// WithConnLimits bounds a Bootstrap host's inbound connections: perAddr
// from one IPv4 address or IPv6 /64, total in all. The defaults leave room
// for the relay's reservations (WithRelayReservations) plus DHT and AutoNAT
// traffic: 64 beyond the reservations per IP, 512 beyond the total.
func WithConnLimits(perAddr, total int) Option {
	return func(c *config) error {
		if perAddr <= 0 || total < perAddr {
			return fmt.Errorf("%w: connection limits %d per address, %d in all", p2p.ErrConfig, perAddr, total)
		}
		c.connsPerAddr, c.connsTotal = perAddr, total
		return c.once("connection limits")
	}
}

// WithAllowAll turns the allowlist off. Only for tools and benchmarks: in a
// run, only clients of the current epoch may connect.
func WithAllowAll() Option {
	return func(c *config) error {
		c.allowAll = true
		return c.once("allow all")
	}
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		c.logger = l
		return c.once("logger")
	}
}

// WithReannounceInterval sets how often the node re-publishes its own
// announcements of the last steps (default 2s; 0 disables). Gossip can lose a
// message while the mesh forms; a re-send with a fresh nonce repairs that.
func WithReannounceInterval(d time.Duration) Option {
	return func(c *config) error {
		c.reannounce = d
		return c.once("reannounce interval")
	}
}

// WithFetchTimeout bounds one attempt to fetch a blob, beyond the time its
// size takes at the minimum rate (WithMinFetchRate) (default 30s). A round
// lasts minutes; a 1 MiB blob takes milliseconds on a healthy link.
func WithFetchTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: fetch timeout %v", p2p.ErrConfig, d)
		}
		c.fetchTimeout = d
		return c.once("fetch timeout")
	}
}

// WithMinFetchRate sets how slow a peer may be before a fetch gives up on
// it: every read of n bytes (at most 64 KiB) from a peer streaming a blob
// must return within stall + n/bytesPerSecond, or the rest of the blob is
// fetched from other peers; and each fetch attempt is allowed the fetch
// timeout plus the blob's size at bytesPerSecond (default 1 MiB/s, 2s).
func WithMinFetchRate(bytesPerSecond int64, stall time.Duration) Option {
	return func(c *config) error {
		if bytesPerSecond <= 0 || stall <= 0 {
			return fmt.Errorf("%w: minimum fetch rate %d B/s, stall %v", p2p.ErrConfig, bytesPerSecond, stall)
		}
		c.minRate, c.stallTimeout = bytesPerSecond, stall
		return c.once("minimum fetch rate")
	}
}

// withClock sets the clock of the blob stream's stall timer and of the fetch
// attempts' timeouts (tests).
func withClock(k clock) Option {
	return func(c *config) error {
		c.clock = k
		return c.once("clock")
	}
}

// withServeHook sets a function the blob stream server calls before each
// block it serves (tests: a peer that stalls mid-blob).
func withServeHook(f func(i int, h coordinator.Hash)) Option {
	return func(c *config) error {
		c.serveHook = f
		return c.once("serve hook")
	}
}

// withoutStream makes Fetch use bitswap alone (benchmarks of the fallback).
func withoutStream() Option {
	return func(c *config) error {
		c.noStream = true
		return c.once("without stream")
	}
}

// withReadHook sets a function a fetch calls before it reads each block
// from a blob stream (tests: to know which read a stall timer guards).
func withReadHook(f func(block int)) Option {
	return func(c *config) error {
		c.readHook = f
		return c.once("read hook")
	}
}

// withStreamPeers sets how many peers besides the announcer a fetch
// streams from (default 4; tests set 0 to exercise the bitswap fallback).
func withStreamPeers(k int) Option {
	return func(c *config) error {
		c.streamPeers = k
		return c.once("stream peers")
	}
}

// WithFetchRetries sets how many times a failed fetch is retried (default 3)
// and the first backoff (default 250ms, doubling each retry).
func WithFetchRetries(retries int, backoff time.Duration) Option {
	return func(c *config) error {
		if retries < 0 || backoff < 0 {
			return fmt.Errorf("%w: retries %d, backoff %v", p2p.ErrConfig, retries, backoff)
		}
		c.fetchRetries, c.retryBackoff = retries, backoff
		return c.once("fetch retries")
	}
}

// WithCheckpointConcurrency bounds the block requests in flight while
// fetching a checkpoint (default 32: each 1 MiB block costs a round trip
// before it flows, so at 8 a joiner on a 1 Gbit/s, 50 ms link fetched a
// 5 GB model in 69 s against the link's 40 s, and at 32 in 47 s; on lossy
// links, where each flow is held to its loss-limited rate, 2.7× faster;
// docs/scale.md).
func WithCheckpointConcurrency(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("%w: checkpoint concurrency %d", p2p.ErrConfig, n)
		}
		c.ckptConcurrency = n
		return c.once("checkpoint concurrency")
	}
}

// WithCheckpointProgress sets a callback run after each verified checkpoint
// block. It is called from the fetching goroutines, possibly concurrently:
// keep it short and safe for concurrent use.
func WithCheckpointProgress(f func(done, total int)) Option {
	return func(c *config) error {
		c.ckptProgress = f
		return c.once("checkpoint progress")
	}
}

func newConfig(opts []Option) (*config, error) {
	c, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	if c.runID == nil {
		return nil, fmt.Errorf("%w: WithRunID is required", p2p.ErrConfig)
	}
	return c, nil
}

// applyOptions applies opts and fills in the defaults.
func applyOptions(opts []Option) (*config, error) {
	c := &config{set: map[string]bool{}}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	// Defaults last, so that an option can tell whether it was set.
	if c.listen == nil {
		c.listen = []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"}
	}
	if c.logger == nil {
		c.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if !c.set["reannounce interval"] {
		c.reannounce = 2 * time.Second
	}
	if c.fetchTimeout == 0 {
		c.fetchTimeout = 30 * time.Second
	}
	if !c.set["fetch retries"] {
		c.fetchRetries, c.retryBackoff = 3, 250*time.Millisecond
	}
	if c.minRate == 0 {
		c.minRate, c.stallTimeout = 1<<20, 2*time.Second
	}
	if !c.set["stream peers"] {
		c.streamPeers = 4
	}
	if c.clock == nil {
		c.clock = realClock{}
	}
	if c.metrics == nil {
		c.metrics = NewMetrics(nil)
	}
	if c.idleTimeout == 0 {
		c.idleTimeout = 5 * time.Minute
	}
	if c.ckptConcurrency == 0 {
		c.ckptConcurrency = 32
	}
	return c, nil
}

// identity is the configured key (WithKey, or WithKeyFile loaded or
// created), raw and as libp2p's type.
func (c *config) identity() (ed25519.PrivateKey, crypto.PrivKey, error) {
	key := c.key
	if c.keyFile != "" {
		var err error
		if key, err = LoadOrCreateKey(c.keyFile); err != nil {
			return nil, nil, err
		}
	}
	if key == nil {
		return nil, nil, fmt.Errorf("%w: WithKey or WithKeyFile is required", p2p.ErrConfig)
	}
	lk, err := crypto.UnmarshalEd25519PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", p2p.ErrConfig, err)
	}
	return key, lk, nil
}
