package libp2p

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	golibp2p "github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/psyche-go/psyche/internal/connlimit"
)

// A Bootstrap host is open to the internet, so what one address can hold
// and how long a connection may sit there doing nothing are bounded, as on
// the server's HTTP listeners:
//
//   - per address: an IPv4 address, or an IPv6 /64 (what one host is given),
//     may hold as many connections as the relay's reservations per IP, plus
//     room for DHT queries and AutoNAT dial-backs. libp2p's own default is 8
//     per IPv4 address, which capped "256 reservations per IP" (trainers
//     behind one NAT) at 8 in practice;
//   - in all: inbound connections are capped at the reservations plus room
//     for the DHT's users, and the connection manager trims back to its low
//     mark, idle untagged connections first, before that cap is reached;
//     its marks sit above the reservations, so that it never closes a
//     reserved peer's connection to make room (libp2p's default marks,
//     160-192, would churn a relay of more reserved peers). At the cap, a
//     newcomer takes the place of the oldest connection of the address
//     that holds the most, if it holds at least two more than the
//     newcomer's, as on the HTTP listeners (connCap); a run member's
//     connection is never the one closed. Before, the cap refused the
//     newcomer: addresses that together filled it kept everyone out;
//   - idle: a connection with no stream, no reservation and no run member
//     behind it is closed after the idle timeout (reapIdle);
//   - the handshake: libp2p's upgrader gives a TCP connection 15 s to finish
//     its security and muxer handshakes, and QUIC's handshake idle timeout
//     is 5 s; neither is configurable through libp2p's options, and both are
//     short enough.
const (
	bootstrapSpareConns = 64  // per address, beyond the reservations
	bootstrapSpareTotal = 512 // in all, beyond the reservations
)

// bootstrapLimits are the Bootstrap host's resource and connection manager
// options for c's reservation bounds, and the cap on its inbound
// connections in all (register it with the host's network).
func bootstrapLimits(c *config, member func(peer.ID) bool) ([]golibp2p.Option, *connCap, error) {
	r := relayResources(c)
	perAddr := r.MaxReservationsPerIP + bootstrapSpareConns
	total := r.MaxReservations + bootstrapSpareTotal
	if c.connsPerAddr > 0 {
		perAddr, total = c.connsPerAddr, c.connsTotal
	}
	limits := rcmgr.DefaultLimits
	golibp2p.SetDefaultServiceLimits(&limits)
	// The resource manager refuses by count, whoever asks: its cap on the
	// connections in all sits above connCap's, which decides by address,
	// so that a newcomer gets through the handshake to take a place.
	// Handshakes in flight stay capped at total (the transient scope).
	scaled := rcmgr.PartialLimitConfig{System: rcmgr.ResourceLimits{
		ConnsInbound: rcmgr.LimitVal(total + bootstrapSpareTotal),
		Conns:        rcmgr.LimitVal(total + bootstrapSpareTotal),
		FD:           rcmgr.LimitVal(total + bootstrapSpareTotal),
	}, Transient: rcmgr.ResourceLimits{
		ConnsInbound: rcmgr.LimitVal(total),
		Conns:        rcmgr.LimitVal(total + bootstrapSpareTotal),
		FD:           rcmgr.LimitVal(total + bootstrapSpareTotal),
	}}.Build(limits.AutoScale())
	opts := []rcmgr.Option{rcmgr.WithMetricsDisabled(),
		rcmgr.WithLimitPerSubnet(
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 32, ConnCount: perAddr}},
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 64, ConnCount: perAddr}})}
	if c.limitLoopback {
		opts = append(opts, rcmgr.WithNetworkPrefixLimit([]rcmgr.NetworkPrefixLimit{}, []rcmgr.NetworkPrefixLimit{}))
	}
	mgr, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(scaled), opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("p2p: bootstrap resource manager: %w", err)
	}
	// The connection manager trims before the cap refuses, and above the
	// reservations when the cap leaves room for them.
	low, high := max(total-total/4, r.MaxReservations+bootstrapSpareTotal/4), max(total-total/8, r.MaxReservations+bootstrapSpareTotal/2)
	cm, err := connmgr.NewConnManager(min(low, high), high, connmgr.WithGracePeriod(time.Minute))
	if err != nil {
		return nil, nil, fmt.Errorf("p2p: bootstrap connection manager: %w", err)
	}
	capped := &connCap{pool: connlimit.NewPool(total, perAddr, false), member: member, loopback: c.limitLoopback,
		slots: map[network.Conn]*connlimit.Slot{}}
	return []golibp2p.Option{golibp2p.ResourceManager(mgr), golibp2p.ConnectionManager(cm)}, capped, nil
}

// connCap caps a Bootstrap host's inbound connections in all with
// internal/connlimit's policy (the HTTP listeners'): it counts each one
// once established, by address group (an IPv4 address, an IPv6 /64), and
// when the count is at the cap, a newcomer takes the place of the oldest
// sheddable connection of the group that holds the most, if that group
// holds at least two more than the newcomer's; otherwise the newcomer is
// closed. A run member's connection is not sheddable (it is marked when
// it connects, and again at every idle sweep as the runs change): a
// trainer's relay is not taken from it for a stranger. Loopback is not
// counted, as the resource manager does not count it (but see
// limitLoopback).
type connCap struct {
	pool     *connlimit.Pool
	member   func(peer.ID) bool
	loopback bool // count loopback connections too (tests)

	mu    sync.Mutex
	slots map[network.Conn]*connlimit.Slot
}

var _ network.Notifiee = (*connCap)(nil)

func (c *connCap) Listen(network.Network, ma.Multiaddr)      {}
func (c *connCap) ListenClose(network.Network, ma.Multiaddr) {}

// Connected takes a place for an inbound connection, or closes it.
func (c *connCap) Connected(_ network.Network, conn network.Conn) {
	if conn.Stat().Direction != network.DirInbound {
		return
	}
	group, ok := c.group(conn.RemoteMultiaddr())
	if !ok {
		return
	}
	// Closed from a goroutine of its own: the network is notifying.
	slot := c.pool.Acquire(group, !c.member(conn.RemotePeer()), func() { go conn.Close() })
	if slot == nil {
		go conn.Close()
		return
	}
	c.mu.Lock()
	c.slots[conn] = slot
	c.mu.Unlock()
}

// Disconnected gives a connection's place back.
func (c *connCap) Disconnected(_ network.Network, conn network.Conn) {
	c.mu.Lock()
	slot := c.slots[conn]
	delete(c.slots, conn)
	c.mu.Unlock()
	if slot != nil {
		slot.Release()
	}
}

// refresh marks conn sheddable unless its peer is a run member now.
func (c *connCap) refresh(conn network.Conn) {
	c.mu.Lock()
	slot := c.slots[conn]
	c.mu.Unlock()
	if slot != nil {
		slot.SetSheddable(!c.member(conn.RemotePeer()))
	}
}

// group is the address group a connection from a counts in; false: it
// is not counted.
func (c *connCap) group(a ma.Multiaddr) (string, bool) {
	ip, err := manet.ToIP(a)
	if err != nil {
		return "", false
	}
	addr, ok := netip.AddrFromSlice(ip)
	if !ok || (addr.Unmap().IsLoopback() && !c.loopback) {
		return "", false
	}
	return connlimit.Group(addr).String(), true
}

// reservationTag is the connection manager tag libp2p's relay service puts
// on a peer while it holds a reservation.
const reservationTag = "relay-reservation"

// reapIdle closes, every quarter of the idle timeout, the connections that
// have carried no stream for the idle timeout and whose peer holds no
// reservation and is no run's member. A stream seen open at a sweep counts as activity, so a
// connection in use (a circuit is a stream) is never closed; a peer that
// only queried the DHT between two sweeps may be, and dials again.
func (b *Bootstrap) reapIdle(idle time.Duration) {
	t := time.NewTicker(idle / 4)
	defer t.Stop()
	active := map[network.Conn]time.Time{}
	for {
		select {
		case <-b.life.Done():
			return
		case now := <-t.C:
			seen := map[network.Conn]time.Time{}
			closed := 0
			for _, c := range b.host.Network().Conns() {
				b.caps.refresh(c)
				last, ok := active[c]
				if !ok {
					last = c.Stat().Opened
				}
				if len(c.GetStreams()) > 0 || b.reserved(c) || b.known(c) {
					last = now
				}
				if now.Sub(last) >= idle {
					_ = c.Close()
					closed++
					continue
				}
				seen[c] = last
			}
			active = seen
			if closed > 0 {
				b.log.Debug("closed idle connections", "count", closed, "idle", idle)
			}
		}
	}
}

// known says whether c's peer is one of the runs' members (a server's
// host knows them; an open relay knows nobody): trainers keep their
// connection to the host they bootstrap from, and would only dial it again.
func (b *Bootstrap) known(c network.Conn) bool { return b.knownPeer(c.RemotePeer()) }

func (b *Bootstrap) knownPeer(p peer.ID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.members[p]
}

func (b *Bootstrap) reserved(c network.Conn) bool {
	info := b.host.ConnManager().GetTagInfo(c.RemotePeer())
	if info == nil {
		return false
	}
	_, ok := info.Tags[reservationTag]
	return ok
}
