package libp2p

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	golibp2p "github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/psyche-go/psyche/coordinator"
)

// Bootstrap is a well-known host that trainers start from: it serves the
// DHT of each run it is told about (in server mode, so every trainer that
// connects to it can be found through it), answers AutoNAT dial-back
// requests so that trainers learn whether they are reachable, and, with
// WithRelayService, relays connections to trainers that are not. The server
// backend runs one (psyche server), and psyche relay runs one on its own for
// Solana runs.
type Bootstrap struct {
	host   host.Host
	log    *slog.Logger
	relay  bool
	life   context.Context
	cancel context.CancelFunc
	closed sync.Once
	caps   *connCap // the cap on inbound connections in all

	mu      sync.Mutex
	dhts    map[string]*dht.IpfsDHT
	members map[peer.ID]bool // the runs' clients and joiners: who may use the relay
	open    bool             // WithOpenRelay: anyone may
}

// NewBootstrap starts a bootstrap host. It takes WithKey or WithKeyFile
// (required: its identity is what trainers are told to dial, so keep it
// stable), WithListenAddrs, WithLogger and WithRelayService.
func NewBootstrap(opts ...Option) (*Bootstrap, error) {
	cfg, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	_, lk, err := cfg.identity()
	if err != nil {
		return nil, err
	}
	b := &Bootstrap{log: cfg.logger, relay: cfg.relayService || cfg.openRelay, open: cfg.openRelay,
		dhts: map[string]*dht.IpfsDHT{}, members: map[peer.ID]bool{}}
	hostOpts := []golibp2p.Option{
		golibp2p.Identity(lk),
		golibp2p.ListenAddrStrings(cfg.listen...),
		golibp2p.Transport(tcp.NewTCPTransport),
		golibp2p.Transport(quic.NewTransport),
		golibp2p.EnableNATService(),
		golibp2p.EnableAutoNATv2(),
		golibp2p.DisableMetrics(),
	}
	limits, caps, err := bootstrapLimits(cfg, b.knownPeer)
	if err != nil {
		return nil, err
	}
	b.caps = caps
	hostOpts = append(hostOpts, limits...)
	if b.relay {
		// Results and checkpoints must move when the relay is the only path,
		// so circuits carry no data or time limit (a limited circuit would
		// also make bitswap and gossip refuse it); who may use the relay is
		// bounded instead, by the ACL (the runs' members) and the relay's
		// reservation and circuit counts.
		// libp2p starts a relay service only on a host it believes publicly
		// reachable; whoever runs a relay says it is (trainers must be able
		// to dial it), and AutoNAT cannot confirm it on a private range.
		hostOpts = append(hostOpts, golibp2p.ForceReachabilityPublic(),
			golibp2p.EnableRelayService(relayv2.WithInfiniteLimits(), relayv2.WithACL(relayACL{b}), relayv2.WithResources(relayResources(cfg))))
	}
	h, err := golibp2p.New(hostOpts...)
	if err != nil {
		return nil, fmt.Errorf("p2p: bootstrap host: %w", err)
	}
	b.host = h
	h.Network().Notify(caps)
	b.life, b.cancel = context.WithCancel(context.Background())
	go b.reapIdle(cfg.idleTimeout)
	return b, nil
}

// SetRuns sets the runs whose DHTs the host serves, each with the p2p keys
// of its clients and joiners. With a relay, only those peers may hold a
// reservation or open a circuit: with no runs, or runs with no members,
// nobody may. (Only a relay made WithOpenRelay serves anyone.)
func (b *Bootstrap) SetRuns(runs map[string][]coordinator.Pubkey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	members := map[peer.ID]bool{}
	for id, keys := range runs {
		if _, ok := b.dhts[id]; !ok {
			d, err := dht.New(b.host, dht.Mode(dht.ModeServer), dht.ProtocolPrefix(DHTPrefix(id)),
				dht.DisableProviders(), dht.DisableValues())
			if err != nil {
				b.log.Error("serving a run's DHT", "run", id, "err", err)
				continue
			}
			b.dhts[id] = d
			b.log.Debug("serving the run's DHT", "run", id)
		}
		for _, k := range keys {
			if p, err := peerIDOf(k); err == nil {
				members[p] = true
			}
		}
	}
	for id, d := range b.dhts {
		if _, ok := runs[id]; !ok {
			_ = d.Close()
			delete(b.dhts, id)
		}
	}
	b.members = members
}

// member says whether p may use the relay.
func (b *Bootstrap) member(p peer.ID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open || b.members[p]
}

// relayACL admits the runs' members to the relay.
type relayACL struct{ b *Bootstrap }

func (a relayACL) AllowReserve(p peer.ID, _ ma.Multiaddr) bool { return a.b.member(p) }
func (a relayACL) AllowConnect(src peer.ID, _ ma.Multiaddr, dest peer.ID) bool {
	return a.b.member(src) && a.b.member(dest)
}

// relayResources are libp2p's defaults with room for a whole run: up to
// 256 clients per run may hold a reservation, several runs share a server.
// WithRelayReservations changes them (an open relay's bound: its operator's
// setting).
func relayResources(c *config) relayv2.Resources {
	r := relayv2.DefaultResources()
	r.MaxReservations = 4096
	r.MaxReservationsPerIP = 256 // many trainers behind one NAT, or on one machine
	r.MaxReservationsPerASN = 4096
	if c.relayReservations > 0 {
		r.MaxReservations, r.MaxReservationsPerASN = c.relayReservations, c.relayReservations
		r.MaxReservationsPerIP = min(c.relayReservationsPerIP, c.relayReservations)
	}
	r.Limit = nil
	return r
}

// ID is the host's peer id.
func (b *Bootstrap) ID() string { return b.host.ID().String() }

// Addrs lists the host's addresses with its /p2p/ id appended.
func (b *Bootstrap) Addrs() []string { return hostAddrs(b.host) }

// Relay says whether the host relays.
func (b *Bootstrap) Relay() bool { return b.relay }

// Run serves until ctx ends, then closes the host.
func (b *Bootstrap) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-b.life.Done():
	}
	return b.Close()
}

// Close stops the host. It is safe to call more than once.
func (b *Bootstrap) Close() error {
	var err error
	b.closed.Do(func() {
		b.mu.Lock()
		for id, d := range b.dhts {
			_ = d.Close()
			delete(b.dhts, id)
		}
		b.mu.Unlock()
		b.cancel()
		err = b.host.Close()
	})
	return err
}
