// Package memnet is an in-memory p2p.Network: the nodes of one Hub reach
// each other through function calls instead of sockets, with the same
// contract as p2p/libp2p (signed announcements validated against the run,
// the step window, the assignment or the epoch's clients; delivery once;
// relaying to peers as gossip does; pulls; payloads checked against their
// commitment; checkpoints offered, voted on and fetched). The trainer's
// driver tests run on it, and p2p/p2ptest holds both implementations to the
// same suite. Equivocate plays a trainer that sends different results to
// different peers.
package memnet

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

// addrPrefix starts every memnet address: "mem/<base58 p2p key>".
const addrPrefix = "mem/"

// Hub is one in-memory network.
type Hub struct {
	mu    sync.Mutex
	nodes map[coordinator.Pubkey]*Node
}

// NewHub returns an empty network.
func NewHub() *Hub { return &Hub{nodes: map[coordinator.Pubkey]*Node{}} }

// Node is one member of a Hub.
type Node struct {
	hub    *Hub
	runID  string
	key    ed25519.PrivateKey
	id     coordinator.Pubkey
	signer coordinator.Pubkey
	out    chan p2p.Announcement
	// notices delivers other trainers' notices (Notices).
	notices chan p2p.Notice

	mu          sync.Mutex
	closed      bool
	peers       map[coordinator.Pubkey]bool
	step        uint32
	clients     map[coordinator.Pubkey]coordinator.ClientID // by p2p key; nil: not set yet
	assignments p2p.Assignments                             // nil: not set yet
	delivered   map[coordinator.Hash]bool                   // commitments handed to the trainer
	held        map[uint32][]p2p.Announcement               // valid announcements by step, for pulls
	blobs       map[coordinator.Hash][]byte                 // own payloads by commitment
	offers      map[uint32]coordinator.Hash                 // epoch → manifest id served
	checkpoints map[coordinator.Hash][]p2p.Tensor
	served      p2p.CheckpointSource // what the checkpoint was read from, closed when it is replaced
	stats       p2p.Stats
	nonce       uint64
	maxPayload  int64
	noticed     map[p2p.NoticeKey]bool // notices handed to the trainer
	// early are notices for a batch not assigned yet in this node's view,
	// of a round it has not reached: judged again when the view moves
	// (SetAssignments).
	early []p2p.Notice
}

var _ p2p.Network = (*Node)(nil)

// Join adds a node with p2p key key, publishing as signer, to the hub.
func (h *Hub) Join(runID string, key ed25519.PrivateKey, signer coordinator.Pubkey) *Node {
	n := &Node{hub: h, runID: runID, key: key, signer: signer, out: make(chan p2p.Announcement, 4096), notices: make(chan p2p.Notice, 1024), noticed: map[p2p.NoticeKey]bool{},
		peers: map[coordinator.Pubkey]bool{}, delivered: map[coordinator.Hash]bool{}, held: map[uint32][]p2p.Announcement{},
		blobs: map[coordinator.Hash][]byte{}, offers: map[uint32]coordinator.Hash{}, checkpoints: map[coordinator.Hash][]p2p.Tensor{},
		stats: p2p.Stats{Rejected: map[string]uint64{}, NoticesRejected: map[string]uint64{}, PeerErrors: map[coordinator.Pubkey]uint64{}, BlocksFrom: map[coordinator.Pubkey]uint64{}}}
	copy(n.id[:], key.Public().(ed25519.PublicKey))
	h.mu.Lock()
	h.nodes[n.id] = n
	h.mu.Unlock()
	return n
}

// Close leaves the hub: peers lose the connection.
func (n *Node) Close() {
	n.hub.mu.Lock()
	delete(n.hub.nodes, n.id)
	n.hub.mu.Unlock()
	n.mu.Lock()
	n.closed = true
	peers := n.peers
	n.peers = map[coordinator.Pubkey]bool{}
	served := n.served
	n.served = nil
	n.mu.Unlock()
	if served != nil {
		served.Close()
	}
	for k := range peers {
		if p := n.hub.node(k); p != nil {
			p.mu.Lock()
			delete(p.peers, n.id)
			p.mu.Unlock()
		}
	}
}

func (h *Hub) node(k coordinator.Pubkey) *Node {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nodes[k]
}

// ID implements p2p.Network.
func (n *Node) ID() coordinator.Pubkey { return n.id }

// Addrs implements p2p.Network.
func (n *Node) Addrs() []string { return []string{addrPrefix + n.id.String()} }

// AddrKey implements p2p.Network.
func (n *Node) AddrKey(addr string) (coordinator.Pubkey, error) {
	rest, ok := strings.CutPrefix(addr, addrPrefix)
	if !ok {
		return coordinator.Pubkey{}, fmt.Errorf("%w: %q is not a memnet address", p2p.ErrBadAddress, addr)
	}
	k, err := coordinator.ParsePubkey(rest)
	if err != nil {
		return k, fmt.Errorf("%w: %v", p2p.ErrBadAddress, err)
	}
	return k, nil
}

// allows reports whether n accepts a connection from k: anyone until the
// epoch's clients are set, then only them.
func (n *Node) allows(k coordinator.Pubkey) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.clients == nil {
		return true
	}
	_, ok := n.clients[k]
	return ok
}

// Connect implements p2p.Network: both sides must allow the other.
func (n *Node) Connect(_ context.Context, addr string) error {
	k, err := n.AddrKey(addr)
	if err != nil {
		return err
	}
	p := n.hub.node(k)
	if p == nil {
		return fmt.Errorf("memnet: %s is not on the network", k)
	}
	if !n.allows(k) || !p.allows(n.id) {
		return fmt.Errorf("memnet: %s and %s do not allow each other", n.id, k)
	}
	n.mu.Lock()
	n.peers[k] = true
	n.mu.Unlock()
	p.mu.Lock()
	p.peers[n.id] = true
	p.mu.Unlock()
	return nil
}

// Peers implements p2p.Network.
func (n *Node) Peers() []coordinator.Pubkey {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]coordinator.Pubkey, 0, len(n.peers))
	for k := range n.peers {
		out = append(out, k)
	}
	sort.Slice(out, func(a, b int) bool { return string(out[a][:]) < string(out[b][:]) })
	return out
}

// connected lists the peers, as nodes.
func (n *Node) connected() []*Node {
	var out []*Node
	for _, k := range n.Peers() {
		if p := n.hub.node(k); p != nil {
			out = append(out, p)
		}
	}
	return out
}

// SetStep implements p2p.Network.
func (n *Node) SetStep(step uint32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.step = step
	for s := range n.held {
		if s+2 < step {
			delete(n.held, s)
		}
	}
	for k := range n.noticed {
		if k.Step+2 < step {
			delete(n.noticed, k)
		}
	}
	n.early = slices.DeleteFunc(n.early, func(no p2p.Notice) bool { return no.Step < step })
}

// SetClients implements p2p.Network: peers that are no longer clients are
// disconnected.
func (n *Node) SetClients(ids []coordinator.ClientID) {
	clients := make(map[coordinator.Pubkey]coordinator.ClientID, len(ids))
	for _, id := range ids {
		clients[id.P2P] = id
	}
	n.mu.Lock()
	n.clients = clients
	var gone []coordinator.Pubkey
	for k := range n.peers {
		if _, ok := clients[k]; !ok {
			gone = append(gone, k)
			delete(n.peers, k)
		}
	}
	n.mu.Unlock()
	for _, k := range gone {
		if p := n.hub.node(k); p != nil {
			p.mu.Lock()
			delete(p.peers, n.id)
			p.mu.Unlock()
		}
	}
}

// SetAssignments implements p2p.Network.
func (n *Node) SetAssignments(as []p2p.Assignment) {
	m := p2p.IndexAssignments(as)
	n.mu.Lock()
	n.assignments = m
	early := n.early
	n.early = nil
	n.mu.Unlock()
	for _, no := range early {
		n.receiveNotice(no)
	}
}

// Publish implements p2p.Network.
func (n *Node) Publish(ctx context.Context, step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
	if err := ctx.Err(); err != nil {
		return p2p.Announcement{}, err
	}
	a, err := n.announce(step, batch, payload)
	if err != nil {
		return a, err
	}
	var q []delivery
	for _, p := range n.connected() {
		q = append(q, delivery{p, a})
	}
	spread(q)
	return a, nil
}

// keep stores an own announcement and its payload, for fetches and pulls.
func (n *Node) keep(a p2p.Announcement, payload []byte) {
	n.mu.Lock()
	n.blobs[a.Commitment] = append([]byte(nil), payload...)
	n.held[a.Step] = append(n.held[a.Step], a)
	n.delivered[a.Commitment] = true
	n.stats.Published++
	n.mu.Unlock()
}

// Equivocate is Publish gone bad, for fault-injection tests: it signs one
// announcement per payload, all for the same step and batch, and hands the
// i-th to the connected peers in to[i] only, all at once; gossip then
// relays every version to everyone, so each peer sees its own version
// first and the others after, as with a real equivocator whose versions
// race through the mesh. It returns the announcements in payload order.
func (n *Node) Equivocate(ctx context.Context, step uint32, batch p2p.BatchRange, payloads [][]byte, to [][]coordinator.Pubkey) ([]p2p.Announcement, error) {
	if len(payloads) != len(to) {
		return nil, fmt.Errorf("memnet: %d payloads for %d groups of peers", len(payloads), len(to))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var (
		out []p2p.Announcement
		q   []delivery
	)
	for i, payload := range payloads {
		a, err := n.announce(step, batch, payload)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
		for _, k := range to[i] {
			n.mu.Lock()
			ok := n.peers[k]
			n.mu.Unlock()
			if p := n.hub.node(k); ok && p != nil {
				q = append(q, delivery{p, a})
			}
		}
	}
	spread(q)
	return out, nil
}

// delivery is an announcement on its way to a node.
type delivery struct {
	to *Node
	a  p2p.Announcement
}

// spread carries announcements through the network breadth first, as
// gossip does: a node that takes one as new relays it to its peers.
func spread(q []delivery) {
	for len(q) > 0 {
		d := q[0]
		q = q[1:]
		if d.to.receive(d.a) {
			for _, p := range d.to.connected() {
				q = append(q, delivery{p, d.a})
			}
		}
	}
}

// SetMaxPayload implements p2p.Network.
func (n *Node) SetMaxPayload(bytes int64) {
	n.mu.Lock()
	n.maxPayload = bytes
	n.mu.Unlock()
}

// check validates an announcement as p2p/libp2p's validator does.
func (n *Node) check(a *p2p.Announcement) error {
	if err := a.Verify(); err != nil {
		if !a.SignedMalformed() {
			return err
		}
		if verr := n.checkView(a); verr != nil {
			return verr
		}
		return signedMalformed{err}
	}
	return n.checkView(a)
}

// signedMalformed is the refusal of a malformed announcement signed by the
// trainer assigned its batch: delivered to this node's trainer (its refused
// result), neither relayed nor served, as p2p/libp2p does.
type signedMalformed struct{ err error }

func (e signedMalformed) Error() string { return e.err.Error() }
func (e signedMalformed) Unwrap() error { return e.err }

// checkView checks the run, the step window and the assignment.
func (n *Node) checkView(a *p2p.Announcement) error {
	return n.checkViewOf(a.RunID, a.Step, a.Batch, a.Trainer)
}

// checkViewOf checks a message's run, step window and assignment (an
// announcement's or a notice's).
func (n *Node) checkViewOf(runID string, step uint32, batch p2p.BatchRange, trainer coordinator.ClientID) error {
	if runID != n.runID {
		return fmt.Errorf("%w: %q", p2p.ErrWrongRun, runID)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if lo := n.step - min(n.step, 2); step < lo || step > n.step+1 {
		return fmt.Errorf("%w: step %d at %d", p2p.ErrStepOutOfWindow, step, n.step)
	}
	if n.assignments != nil {
		return n.assignments.Check(step, batch, trainer)
	}
	if id, ok := n.clients[trainer.P2P]; n.clients != nil && (!ok || id != trainer) {
		return fmt.Errorf("%w: not a client of the epoch", p2p.ErrNotAssigned)
	}
	return nil
}

// receive takes a gossiped announcement: valid and new, it is held for
// pulls and delivered once, and receive reports that it is new (to be
// relayed). Delivery is by commitment: a second announcement of the same
// batch with another commitment (an equivocating trainer) is new, and is
// delivered too, so that the trainer sees the evidence.
func (n *Node) receive(a p2p.Announcement) bool {
	err := n.check(&a)
	evidence := errors.As(err, new(signedMalformed))
	if err != nil {
		n.reject(err)
		if !evidence {
			return false
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !evidence {
		n.stats.Accepted++
	}
	if n.delivered[a.Commitment] {
		return false
	}
	n.delivered[a.Commitment] = true
	if !evidence {
		n.held[a.Step] = append(n.held[a.Step], a)
	}
	n.stats.Delivered++
	select {
	case n.out <- a:
	default:
		delete(n.delivered, a.Commitment) // a pull can still return it
		n.stats.Dropped++
	}
	return !evidence
}

// reject counts a refused announcement by its reason, rejectNotice a
// refused notice, as p2p/libp2p does.
func (n *Node) reject(err error) {
	reason := rejectReason(err)
	n.mu.Lock()
	n.stats.Rejected[reason]++
	n.mu.Unlock()
}

func (n *Node) rejectNotice(err error) {
	reason := rejectReason(err)
	n.mu.Lock()
	n.stats.NoticesRejected[reason]++
	n.mu.Unlock()
}

func rejectReason(err error) string {
	reason := "malformed"
	for _, r := range []struct {
		err  error
		name string
	}{{p2p.ErrBadSignature, "bad_signature"}, {p2p.ErrWrongRun, "wrong_run"}, {p2p.ErrStepOutOfWindow, "step_window"},
		{p2p.ErrNotAssigned, "not_assigned"}, {p2p.ErrOversize, "oversize"}, {p2p.ErrReplayed, "replayed"}} {
		if errors.Is(err, r.err) {
			reason = r.name
			break
		}
	}
	return reason
}

// Announcements implements p2p.Network.
func (n *Node) Announcements() <-chan p2p.Announcement { return n.out }

// Pull implements p2p.Network.
func (n *Node) Pull(ctx context.Context, step uint32) ([]p2p.Announcement, error) {
	var out []p2p.Announcement
	for _, p := range n.connected() {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		p.mu.Lock()
		list := append([]p2p.Announcement(nil), p.held[step]...)
		p.mu.Unlock()
		for _, a := range list {
			if err := n.check(&a); err != nil {
				n.reject(err)
				continue
			}
			n.mu.Lock()
			n.stats.Accepted++
			if !n.delivered[a.Commitment] {
				n.delivered[a.Commitment] = true
				n.held[a.Step] = append(n.held[a.Step], a)
				out = append(out, a)
			}
			n.mu.Unlock()
		}
	}
	return out, nil
}

// announce signs a fresh announcement of payload for step and batch and
// keeps the payload to serve it.
func (n *Node) announce(step uint32, batch p2p.BatchRange, payload []byte) (p2p.Announcement, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return p2p.Announcement{}, p2p.ErrClosed
	}
	n.nonce++
	a := p2p.Announcement{RunID: n.runID, Step: step, Batch: batch, Trainer: coordinator.ClientID{Signer: n.signer},
		Commitment: p2p.Commitment(step, batch, payload), Nonce: n.nonce,
		Blob: p2p.BlobRef{Size: uint64(len(payload)), Blocks: p2p.BlockDigests(payload)}}
	n.mu.Unlock()
	if err := a.Sign(n.key); err != nil {
		return a, err
	}
	n.keep(a, payload)
	return a, nil
}

// Fetch implements p2p.Network: the payload comes from the announcer, if
// connected, and must match the commitment.
func (n *Node) Fetch(ctx context.Context, a p2p.Announcement) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := a.Check(); err != nil {
		return nil, err
	}
	n.mu.Lock()
	limit := n.maxPayload
	n.mu.Unlock()
	if err := a.CheckSize(limit); err != nil {
		return nil, err
	}
	from := n
	if a.Trainer.P2P != n.id {
		n.mu.Lock()
		ok := n.peers[a.Trainer.P2P]
		n.mu.Unlock()
		if from = n.hub.node(a.Trainer.P2P); !ok || from == nil {
			n.mu.Lock()
			n.stats.FetchFailures++
			n.stats.PeerErrors[a.Trainer.P2P]++
			n.mu.Unlock()
			return nil, fmt.Errorf("%w: the announcer is not connected", p2p.ErrFetchFailed)
		}
	}
	from.mu.Lock()
	payload, ok := from.blobs[a.Commitment]
	from.mu.Unlock()
	if !ok || p2p.Commitment(a.Step, a.Batch, payload) != a.Commitment {
		return nil, p2p.ErrCommitmentMismatch
	}
	n.mu.Lock()
	n.stats.BlobsFetched++
	n.stats.BlocksFrom[from.id] += uint64(len(a.Blob.Blocks))
	n.mu.Unlock()
	return append([]byte(nil), payload...), nil
}

// ShareCheckpoint implements p2p.Network.
func (n *Node) ShareCheckpoint(_ context.Context, epoch uint32, src p2p.CheckpointSource) (coordinator.Hash, error) {
	// Read whole (this network keeps checkpoints in memory), but kept open
	// until the next share or Close, as a libp2p node keeps the source it
	// serves from: a caller may go on reading it meanwhile.
	tensors, err := p2p.ReadTensors(src)
	if err != nil {
		src.Close()
		return coordinator.Hash{}, err
	}
	m := p2p.CheckpointManifest{}
	for _, t := range tensors {
		m.Tensors = append(m.Tensors, p2p.TensorEntry{Name: t.Name, DType: t.DType, Shape: t.Shape,
			Blob: p2p.BlobRef{Size: uint64(len(t.Data)), Blocks: p2p.BlockDigests(t.Data)}})
	}
	id, err := m.ID()
	if err != nil {
		src.Close()
		return id, err
	}
	n.mu.Lock()
	n.offers[epoch] = id
	n.checkpoints = map[coordinator.Hash][]p2p.Tensor{id: tensors}
	old := n.served
	n.served = src
	n.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return id, nil
}

// FindCheckpoint implements p2p.Network: the manifest id most of the
// connected peers in from offer for epoch.
func (n *Node) FindCheckpoint(_ context.Context, epoch uint32, from []coordinator.Pubkey) (coordinator.Hash, error) {
	votes := map[coordinator.Hash]int{}
	reachable := n.reachable(from)
	for _, p := range reachable {
		p.mu.Lock()
		id, offered := p.offers[epoch]
		p.mu.Unlock()
		if offered {
			votes[id]++
		}
	}
	id, err := p2p.MajorityOffer(votes, len(reachable))
	switch {
	case errors.Is(err, p2p.ErrNoCheckpoint) && len(reachable) == len(from):
		return id, fmt.Errorf("%w for epoch %d among %d peers: %w", p2p.ErrNoCheckpoint, epoch, len(from), p2p.ErrNoHolder)
	case errors.Is(err, p2p.ErrNoCheckpoint):
		return id, fmt.Errorf("%w for epoch %d among %d peers (%d reachable)", p2p.ErrNoCheckpoint, epoch, len(from), len(reachable))
	}
	return id, err
}

// reachable lists the nodes of from that n is connected to.
func (n *Node) reachable(from []coordinator.Pubkey) []*Node {
	var out []*Node
	for _, k := range from {
		n.mu.Lock()
		ok := n.peers[k]
		n.mu.Unlock()
		if p := n.hub.node(k); ok && p != nil {
			out = append(out, p)
		}
	}
	return out
}

// FetchCheckpoint implements p2p.Network: the tensors of a connected
// peer that serves id, written into the file.
func (n *Node) FetchCheckpoint(_ context.Context, id coordinator.Hash, from []coordinator.Pubkey, into *p2p.CheckpointFile) error {
	for _, p := range n.reachable(from) {
		p.mu.Lock()
		ts, has := p.checkpoints[id]
		p.mu.Unlock()
		if !has {
			continue
		}
		// The manifest the libp2p node would fetch first.
		m := p2p.CheckpointManifest{}
		for _, t := range ts {
			m.Tensors = append(m.Tensors, p2p.TensorEntry{Name: t.Name, DType: t.DType, Shape: t.Shape,
				Blob: p2p.BlobRef{Size: uint64(len(t.Data)), Blocks: p2p.BlockDigests(t.Data)}})
		}
		if err := m.Match(into.Specs()); err != nil {
			return err
		}
		off := int64(0)
		for _, t := range ts {
			if _, err := into.WriteAt(t.Data, off); err != nil {
				return err
			}
			off += int64(len(t.Data))
		}
		into.Verified(m)
		n.mu.Lock()
		n.stats.CheckpointBlocks += uint64(len(ts))
		n.mu.Unlock()
		return nil
	}
	return fmt.Errorf("%w: no connected peer serves %x", p2p.ErrFetchFailed, id[:8])
}

// Stats implements p2p.Network.
// ReportPeer implements p2p.Network: the report is counted as a peer error
// (memnet has no gossip scores).
func (n *Node) ReportPeer(k coordinator.Pubkey, _ string) {
	n.mu.Lock()
	n.stats.PeerErrors[k]++
	n.mu.Unlock()
}

func (n *Node) Stats() p2p.Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.stats
	s.Rejected, s.NoticesRejected = clone(s.Rejected), clone(s.NoticesRejected)
	s.PeerErrors, s.BlocksFrom = clone(s.PeerErrors), clone(s.BlocksFrom)
	return s
}

func clone[K comparable](m map[K]uint64) map[K]uint64 {
	out := make(map[K]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
