package libp2p

import (
	"fmt"
	"time"

	golibp2p "github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
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
//     160-192, would churn a relay of more reserved peers);
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
// options for c's reservation bounds.
func bootstrapLimits(c *config) ([]golibp2p.Option, error) {
	r := relayResources(c)
	perAddr := r.MaxReservationsPerIP + bootstrapSpareConns
	total := r.MaxReservations + bootstrapSpareTotal
	if c.connsPerAddr > 0 {
		perAddr, total = c.connsPerAddr, c.connsTotal
	}
	limits := rcmgr.DefaultLimits
	golibp2p.SetDefaultServiceLimits(&limits)
	scaled := rcmgr.PartialLimitConfig{System: rcmgr.ResourceLimits{
		ConnsInbound: rcmgr.LimitVal(total),
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
		return nil, fmt.Errorf("p2p: bootstrap resource manager: %w", err)
	}
	// The connection manager trims before the cap refuses, and above the
	// reservations when the cap leaves room for them.
	low, high := max(total-total/4, r.MaxReservations+bootstrapSpareTotal/4), max(total-total/8, r.MaxReservations+bootstrapSpareTotal/2)
	cm, err := connmgr.NewConnManager(min(low, high), high, connmgr.WithGracePeriod(time.Minute))
	if err != nil {
		return nil, fmt.Errorf("p2p: bootstrap connection manager: %w", err)
	}
	return []golibp2p.Option{golibp2p.ResourceManager(mgr), golibp2p.ConnectionManager(cm)}, nil
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
func (b *Bootstrap) known(c network.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.members[c.RemotePeer()]
}

func (b *Bootstrap) reserved(c network.Conn) bool {
	info := b.host.ConnManager().GetTagInfo(c.RemotePeer())
	if info == nil {
		return false
	}
	_, ok := info.Tags[reservationTag]
	return ok
}
