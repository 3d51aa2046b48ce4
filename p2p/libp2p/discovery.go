package libp2p

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/psyche-go/psyche/coordinator"
)

// How trainers find each other. The coordinator tells every trainer the
// other clients' p2p identities; their addresses come from a Kademlia DHT
// whose protocol is namespaced by the run (so runs never mix routing
// tables), bootstrapped from the server backend's host, --bootstrap peers
// and, on a LAN, mDNS. A node keeps trying to reach every client of the
// epoch it is not connected to, backing off per peer, until it does.

// DHTPrefix is the protocol prefix of a run's DHT: its messages travel on
// DHTPrefix(run)+"/kad/1.0.0".
func DHTPrefix(runID string) protocol.ID {
	return protocol.ID(fmt.Sprintf("/psyche/run/%x", runID))
}

// mdnsName is the run's mDNS service name: a DNS label (at most 63 bytes),
// so the run id is hashed rather than spelled.
func mdnsName(runID string) string {
	h := sha256.Sum256([]byte("psyche mdns " + runID))
	return "psyche-" + hex.EncodeToString(h[:8])
}

// Paths a connection to a peer can take.
const (
	PathDirect      = "direct"       // dialed or accepted on the peer's own address
	PathHolePunched = "hole-punched" // direct, opened by DCUtR through a relayed connection
	PathRelayed     = "relayed"      // through a circuit relay v2
)

// Reach backoff: a client that cannot be reached yet (it does not list us
// yet, or it is still starting) is tried again after 1 s, then 2, 4, … up to
// 30 s. A dial that connects counts as a try too: a peer whose allowlist
// does not hold us yet (we joined for its next epoch) completes the
// handshake and closes the connection at once, and redialling it every
// second would churn connections until its epoch ends. The loss of a
// connection that stayed up reachStable or longer resets the backoff.
const (
	reachFirstBackoff = time.Second
	reachMaxBackoff   = 30 * time.Second
	reachTimeout      = 10 * time.Second
	reachStable       = 10 * time.Second
)

type reachState struct {
	next    time.Time
	backoff time.Duration
	busy    bool
	warned  bool
}

// tried schedules the next dial of a peer just dialled (connected or not).
func (st *reachState) tried(now time.Time) {
	st.next = now.Add(st.backoff)
	st.backoff = min(2*st.backoff, reachMaxBackoff)
}

// dropped notes that the last connection to the peer closed after lived:
// one that had stayed up is redialled at once.
func (st *reachState) dropped(lived time.Duration) {
	if lived >= reachStable {
		st.backoff, st.next = reachFirstBackoff, time.Time{}
	}
}

// discovery holds the node's DHT, mDNS service and reach bookkeeping.
type discovery struct {
	dht  *dht.IpfsDHT
	mdns interface{ Close() error }
	boot []peer.AddrInfo

	mu      sync.Mutex
	reach   map[peer.ID]*reachState
	punched map[peer.ID]bool // direct connections that DCUtR opened
}

func (n *Node) startDiscovery(boot []peer.AddrInfo) error {
	d := &discovery{boot: boot, reach: map[peer.ID]*reachState{}, punched: map[peer.ID]bool{}}
	n.disc = d
	for _, ai := range boot {
		n.host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.PermanentAddrTTL)
	}
	k, err := dht.New(n.host, dht.Mode(dht.ModeAutoServer), dht.ProtocolPrefix(DHTPrefix(*n.cfg.runID)),
		dht.DisableProviders(), dht.DisableValues(), dht.BootstrapPeers(boot...))
	if err != nil {
		return fmt.Errorf("p2p: dht: %w", err)
	}
	d.dht = k
	if n.cfg.mdns {
		s := mdns.NewMdnsService(n.host, mdnsName(*n.cfg.runID), mdnsNotifee{n})
		if err := s.Start(); err != nil {
			n.log.Warn("mDNS discovery unavailable", "err", err)
		} else {
			d.mdns = s
		}
	}
	return nil
}

func (d *discovery) close() {
	if d == nil {
		return
	}
	if d.mdns != nil {
		_ = d.mdns.Close()
	}
	if d.dht != nil {
		_ = d.dht.Close()
	}
}

// mdnsNotifee records peers found on the LAN; the reach loop dials them
// once the coordinator lists them (the allowlist refuses them before).
type mdnsNotifee struct{ n *Node }

func (m mdnsNotifee) HandlePeerFound(ai peer.AddrInfo) {
	if ai.ID == m.n.host.ID() {
		return
	}
	m.n.host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.AddressTTL)
	m.n.log.Debug("mDNS found a peer", "remote", ai.ID.String())
}

// discoveryLoop tries, every second, to reach the bootstrap peers and the
// epoch's clients that are not connected.
func (n *Node) discoveryLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		n.reachAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Node) reachAll(ctx context.Context) {
	var want []peer.ID
	for _, ai := range n.disc.boot {
		want = append(want, ai.ID)
	}
	n.mu.Lock()
	for k := range n.clients {
		if k == n.self {
			continue
		}
		if p, err := peerIDOf(k); err == nil {
			want = append(want, p)
		}
	}
	n.mu.Unlock()
	now := time.Now()
	for _, p := range want {
		if n.host.Network().Connectedness(p) == network.Connected {
			continue
		}
		d := n.disc
		d.mu.Lock()
		st := d.reach[p]
		if st == nil {
			st = &reachState{backoff: reachFirstBackoff}
			d.reach[p] = st
		}
		if st.busy || now.Before(st.next) {
			d.mu.Unlock()
			continue
		}
		st.busy = true
		d.mu.Unlock()
		go n.reachOne(ctx, p)
	}
}

// reachOne dials p on the addresses it is known by, and otherwise asks the
// DHT where it is (a lookup that dials it on the way).
func (n *Node) reachOne(ctx context.Context, p peer.ID) {
	ctx, cancel := context.WithTimeout(ctx, reachTimeout)
	defer cancel()
	err := n.dialKnown(ctx, p)
	if err != nil {
		var ai peer.AddrInfo
		if ai, err = n.disc.dht.FindPeer(ctx, p); err == nil {
			err = n.host.Connect(ctx, ai)
		}
	}
	d := n.disc
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.reach[p]
	st.busy = false
	st.tried(time.Now())
	if err == nil {
		st.warned = false
		return
	}
	if ctx.Err() != nil && n.life.Err() != nil {
		return
	}
	if n.isBootstrap(p) && !st.warned {
		st.warned = true
		n.log.Warn("bootstrap peer unreachable; trying again and using the others meanwhile", "addr", n.bootAddr(p), "err", err)
		return
	}
	n.log.Debug("peer not reachable yet", "remote", p.String(), "err", err)
}

func (n *Node) dialKnown(ctx context.Context, p peer.ID) error {
	addrs := n.host.Peerstore().Addrs(p)
	if len(addrs) == 0 {
		return fmt.Errorf("no known address")
	}
	return n.host.Connect(network.WithForceDirectDial(ctx, "psyche: reach"), peer.AddrInfo{ID: p, Addrs: addrs})
}

func (n *Node) isBootstrap(p peer.ID) bool {
	for _, ai := range n.disc.boot {
		if ai.ID == p {
			return true
		}
	}
	return false
}

func (n *Node) bootAddr(p peer.ID) string {
	for _, ai := range n.disc.boot {
		if ai.ID == p {
			if addrs, err := peer.AddrInfoToP2pAddrs(&ai); err == nil && len(addrs) > 0 {
				return addrs[0].String()
			}
		}
	}
	return p.String()
}

// connPath says how c reaches its peer.
func (n *Node) connPath(c network.Conn) string {
	if isRelayed(c.RemoteMultiaddr()) {
		return PathRelayed
	}
	n.disc.mu.Lock()
	defer n.disc.mu.Unlock()
	if n.disc.punched[c.RemotePeer()] {
		return PathHolePunched
	}
	return PathDirect
}

func isRelayed(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// Paths says, for every connected peer, the best path it is connected by:
// direct (or hole-punched) when any direct connection is open, else relayed.
func (n *Node) Paths() map[coordinator.Pubkey]string {
	out := map[coordinator.Pubkey]string{}
	for _, p := range n.host.Network().Peers() {
		k, ok := pubkeyOf(p)
		if !ok {
			continue
		}
		best := ""
		for _, c := range n.host.Network().ConnsToPeer(p) {
			if path := n.connPath(c); best == "" || best == PathRelayed {
				best = path
			}
		}
		if best != "" {
			out[k] = best
		}
	}
	return out
}

// countPaths sets the connections gauge: peers by their best path.
func (n *Node) countPaths() {
	counts := map[string]int{PathDirect: 0, PathHolePunched: 0, PathRelayed: 0}
	for _, path := range n.Paths() {
		counts[path]++
	}
	for path, c := range counts {
		n.m.Paths.WithLabelValues(path).Set(float64(c))
	}
}

// onConnected logs a new connection with its path.
func (n *Node) onConnected(c network.Conn) {
	n.m.Peers.Set(float64(len(n.host.Network().Peers())))
	n.countPaths()
	n.log.Info("peer connected", "remote", c.RemotePeer().String(), "path", n.connPath(c), "addr", c.RemoteMultiaddr().String(), "dir", c.Stat().Direction.String())
}

func (n *Node) onDisconnected(c network.Conn) {
	n.m.Peers.Set(float64(len(n.host.Network().Peers())))
	n.countPaths()
	if n.host.Network().Connectedness(c.RemotePeer()) != network.Connected {
		n.disc.mu.Lock()
		delete(n.disc.punched, c.RemotePeer())
		if st := n.disc.reach[c.RemotePeer()]; st != nil && !st.busy {
			st.dropped(time.Since(c.Stat().Opened))
		}
		n.disc.mu.Unlock()
	}
}

// punchTracer records which direct connections DCUtR opened, for Paths and
// the logs.
type punchTracer struct {
	mu   sync.Mutex
	node *Node
}

func (t *punchTracer) Trace(e *holepunch.Event) {
	end, ok := e.Evt.(*holepunch.EndHolePunchEvt)
	t.mu.Lock()
	n := t.node
	t.mu.Unlock()
	if !ok || n == nil || n.disc == nil {
		return
	}
	if !end.Success {
		n.log.Info("hole punch failed; staying on the relay", "remote", e.Remote.String(), "err", end.Error)
		return
	}
	n.disc.mu.Lock()
	n.disc.punched[e.Remote] = true
	n.disc.mu.Unlock()
	n.countPaths()
	n.log.Info("hole punch succeeded", "remote", e.Remote.String(), "took", end.EllapsedTime.String())
}

// set gives the tracer its node once the node exists (the host, and so the
// tracer, is made first).
func (t *punchTracer) set(n *Node) { t.mu.Lock(); t.node = n; t.mu.Unlock() }

// parseBootstrap parses bootstrap or relay addresses, logging and skipping
// those that do not parse; duplicates of one peer merge their addresses.
func parseBootstrap(log interface {
	Error(msg string, args ...any)
}, addrs []string) []peer.AddrInfo {
	var out []peer.AddrInfo
	index := map[peer.ID]int{}
	for _, s := range addrs {
		ai, err := parseAddr(s)
		if err != nil {
			log.Error("ignoring a bootstrap address", "err", err)
			continue
		}
		if i, ok := index[ai.ID]; ok {
			out[i].Addrs = append(out[i].Addrs, ai.Addrs...)
			continue
		}
		index[ai.ID] = len(out)
		out = append(out, ai)
	}
	return out
}
