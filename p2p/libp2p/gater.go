package libp2p

import (
	"sync"

	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/psyche-go/psyche/coordinator"
)

// allowlist is the connection gater: only the current epoch's clients and
// the configured bootstrap peers may connect, in either direction. The check
// sits at InterceptSecured (the first point where the remote identity is
// authenticated) for inbound connections and at dial time for outbound ones,
// so a stranger costs a handshake and nothing more: it never reaches gossip
// or bitswap.
type allowlist struct {
	mu        sync.RWMutex
	open      bool // WithAllowAll
	self      peer.ID
	clients   map[peer.ID]struct{}
	bootstrap map[peer.ID]struct{}
}

func newAllowlist(self peer.ID, open bool) *allowlist {
	return &allowlist{open: open, self: self, clients: map[peer.ID]struct{}{}, bootstrap: map[peer.ID]struct{}{}}
}

func (a *allowlist) allowed(p peer.ID) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.open || p == a.self {
		return true
	}
	_, c := a.clients[p]
	_, b := a.bootstrap[p]
	return c || b
}

func (a *allowlist) addBootstrap(p peer.ID) {
	a.mu.Lock()
	a.bootstrap[p] = struct{}{}
	a.mu.Unlock()
}

// setClients replaces the epoch's clients and returns the peers that were
// allowed before and are not any more (their connections must be closed).
func (a *allowlist) setClients(ids []peer.ID) (removed []peer.ID) {
	next := make(map[peer.ID]struct{}, len(ids))
	for _, p := range ids {
		next[p] = struct{}{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for p := range a.clients {
		if _, ok := next[p]; !ok {
			if _, b := a.bootstrap[p]; !b {
				removed = append(removed, p)
			}
		}
	}
	a.clients = next
	return removed
}

func (a *allowlist) InterceptPeerDial(p peer.ID) bool                 { return a.allowed(p) }
func (a *allowlist) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return a.allowed(p) }
func (a *allowlist) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (a *allowlist) InterceptSecured(_ network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	return a.allowed(p)
}
func (a *allowlist) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// peerIDOf turns a coordinator p2p key into a libp2p peer id.
func peerIDOf(k coordinator.Pubkey) (peer.ID, error) {
	pub, err := crypto.UnmarshalEd25519PublicKey(k[:])
	if err != nil {
		return "", err
	}
	return peer.IDFromPublicKey(pub)
}

// pubkeyOf is the inverse of peerIDOf for ed25519 peers.
func pubkeyOf(p peer.ID) (coordinator.Pubkey, bool) {
	var k coordinator.Pubkey
	pub, err := p.ExtractPublicKey()
	if err != nil || pub.Type() != crypto.Ed25519 {
		return k, false
	}
	raw, err := pub.Raw()
	if err != nil || len(raw) != len(k) {
		return k, false
	}
	copy(k[:], raw)
	return k, true
}
