package libp2p

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	ma "github.com/multiformats/go-multiaddr"
)

// A node given relays (WithRelays) keeps a reservation on each of them and
// advertises the relayed address <relay addr>/p2p/<relay>/p2p-circuit while
// it holds one, so that peers that cannot dial it directly reach it through
// the relay; hole punching (DCUtR) then tries to replace that connection by
// a direct one. libp2p's own autorelay is not used: it reserves only once
// AutoNAT has concluded the node is unreachable, which AutoNAT never does
// on private address ranges (a LAN, a NAT'd office, a test), and it builds
// relayed addresses only from a relay's public addresses.

// How reservations are kept: renewed this long before they expire (libp2p
// relays grant an hour), checked every few seconds, retried with a backoff
// when the relay is unreachable or refuses.
const (
	reservationRenewBefore = 2 * time.Minute
	reservationCheck       = 3 * time.Second
)

// relays is the node's relay state. It exists before the host (whose
// address factory reads it), so it holds no pointer to the node.
type relays struct {
	list []peer.AddrInfo

	mu       sync.Mutex
	reserved map[peer.ID]time.Time // relay → when our reservation expires
	// member says whether the node is a member of its run (its key is in
	// the allowlist SetClients gives it: a client or a joiner), which is
	// whom a server's relay admits; joined wakes the reservation loops
	// when it becomes one, so that a refused node asks again at once
	// rather than at the end of its backoff.
	member bool
	joined chan struct{}
}

func newRelays(list []peer.AddrInfo) *relays {
	return &relays{list: list, reserved: map[peer.ID]time.Time{}, joined: make(chan struct{})}
}

// setMember records whether the node is a member of its run; becoming one
// wakes the reservation loops.
func (r *relays) setMember(member bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if member && !r.member {
		close(r.joined)
		r.joined = make(chan struct{})
	}
	r.member = member
}

// membership is whether the node is a member, and the channel closed when
// it next becomes one.
func (r *relays) membership() (bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.member, r.joined
}

// circuitAddrs are the relayed addresses of the reservations held now.
func (r *relays) circuitAddrs() []ma.Multiaddr {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ma.Multiaddr
	now := time.Now()
	for _, ai := range r.list {
		if exp, ok := r.reserved[ai.ID]; !ok || now.After(exp) {
			continue
		}
		circuit, err := ma.NewMultiaddr(fmt.Sprintf("/p2p/%s/p2p-circuit", ai.ID))
		if err != nil {
			continue
		}
		for _, a := range ai.Addrs {
			out = append(out, a.Encapsulate(circuit))
		}
	}
	return out
}

// addrsFactory advertises the relayed addresses beside the direct ones.
func (r *relays) addrsFactory(addrs []ma.Multiaddr) []ma.Multiaddr {
	return append(addrs, r.circuitAddrs()...)
}

func (r *relays) set(p peer.ID, exp time.Time, ok bool) (changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, had := r.reserved[p]
	if ok {
		r.reserved[p] = exp
	} else {
		delete(r.reserved, p)
	}
	return had != ok
}

// relayLoop keeps a reservation on every relay until ctx ends.
func (n *Node) relayLoop(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ai := range n.relays.list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.keepReservation(ctx, ai)
		}()
	}
	wg.Wait()
}

// warnAfterFailures is how many refused reservations in a row, while the
// node is a member of its run, make a warning: with the backoff, about 7 s
// of trying (a server's relay learns of a member as the join is recorded,
// before the trainer does).
const warnAfterFailures = 4

func (n *Node) keepReservation(ctx context.Context, ai peer.AddrInfo) {
	var renewAt time.Time
	backoff := time.Second
	failures := 0
	t := time.NewTicker(reservationCheck)
	defer t.Stop()
	for {
		held := !renewAt.IsZero() && time.Now().Before(renewAt) && n.host.Network().Connectedness(ai.ID) == network.Connected
		if !held {
			rctx, cancel := context.WithTimeout(ctx, reachTimeout)
			err := n.host.Connect(rctx, ai)
			var rsvp *client.Reservation
			if err == nil {
				rsvp, err = client.Reserve(rctx, n.host, ai)
			}
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				renewAt = time.Time{}
				member, joined := n.relays.membership()
				// A server's relay admits its runs' members only (its
				// ACL): a trainer that has not joined yet, or that sits
				// an epoch out, is refused, and asks again as soon as it
				// joins (joined). So only a member's refusals count: a
				// reservation a member lost, or one refused
				// warnAfterFailures times in a row, is a warning; the
				// rest, DEBUG.
				if member {
					failures++
				}
				level := slog.LevelDebug
				if lost := n.relays.set(ai.ID, time.Time{}, false); member && (lost || failures == warnAfterFailures) {
					level = slog.LevelWarn
				}
				n.log.Log(ctx, level, "no reservation on a relay; trying again (direct connections and other relays still work)",
					"relay", ai.ID.String(), "tries", failures, "member", member, "err", reservationError(err))
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
					backoff = min(2*backoff, reachMaxBackoff)
				case <-joined:
					backoff, failures = time.Second, 0
				}
				continue
			}
			backoff, failures = time.Second, 0
			renewAt = rsvp.Expiration.Add(-reservationRenewBefore)
			if n.relays.set(ai.ID, rsvp.Expiration, true) {
				n.log.Info("reachable through a relay", "relay", ai.ID.String(), "expires", rsvp.Expiration.Format(time.RFC3339))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reservationError words a failed reservation: go-libp2p's
// ReservationError prints its inner error even when there is none
// ("err: %!s(<nil>)"), so a refusal is said as the relay's status and
// reason, and other failures as themselves.
func reservationError(err error) string {
	var re client.ReservationError
	if !errors.As(err, &re) {
		return err.Error()
	}
	msg := "the relay answered " + re.Status.String()
	if re.Reason != "" {
		msg += " (" + re.Reason + ")"
	}
	if inner := errors.Unwrap(re); inner != nil {
		msg += ": " + inner.Error()
	}
	return msg
}
