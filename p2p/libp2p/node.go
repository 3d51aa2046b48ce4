package libp2p

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/ipfs/boxo/bitswap"
	bsmsg "github.com/ipfs/boxo/bitswap/message"
	bsnet "github.com/ipfs/boxo/bitswap/network/bsnet"
	"github.com/ipfs/boxo/blockstore"
	ds "github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"
	golibp2p "github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p"
)

var _ p2p.Network = (*Node)(nil)

// Node is one trainer's presence on the network: a libp2p host (TCP and
// QUIC, no relay) behind the epoch allowlist, the run's gossip topic, the
// pull fallback and a bitswap blob store. Create it with New, drive it with
// Run; it closes itself when Run's context ends.
type Node struct {
	cfg    *config
	log    *slog.Logger
	m      *Metrics
	key    ed25519.PrivateKey
	signer coordinator.Pubkey
	self   coordinator.Pubkey

	host   host.Host
	gate   *allowlist
	ps     *pubsub.PubSub
	topic  *pubsub.Topic
	sub    *pubsub.Subscription
	bs     *bitswap.Bitswap
	bstore *servedStore

	life   context.Context // lives until Close; pubsub and bitswap hang off it
	cancel context.CancelFunc
	closed sync.Once
	out    chan p2p.Announcement
	// notices delivers other trainers' notices (Notices).
	notices chan p2p.Notice

	step       atomic.Uint32
	views      atomic.Uint64 // SetAssignments calls: the version of the validator's view (holdEarly)
	nonce      atomic.Uint64
	maxPayload atomic.Int64 // SetMaxPayload

	mu      sync.Mutex
	clients map[coordinator.Pubkey]coordinator.ClientID // by p2p key
	// assignments is what SetAssignments installed (nil: not called yet).
	assignments  p2p.Assignments
	seen         map[nonceKey]uint32      // nonces validated, by step, for replay detection
	delivered    map[deliveryKey]struct{} // announcements already handed to the trainer
	held         map[uint32][][]byte      // accepted encodings by step, served to pullers
	heldKeys     map[deliveryKey]struct{}
	own          map[deliveryKey]p2p.Announcement // our announcements, re-sent while in the window
	stepRefs     map[uint32][]coordinator.Hash
	ckptRefs     []coordinator.Hash
	offered      *checkpointOffer // what joiners are told to fetch
	refs         map[coordinator.Hash]int
	reports      map[peer.ID]*misconduct        // ReportPeer
	rejectLogged map[rejectKey]bool             // (peer, reason) pairs already logged as warnings
	early        map[nonceKey]earlyAnnouncement // a step ahead of the view (holdEarly)
	earlyPer     map[coordinator.Pubkey]int     // early announcements per trainer
	noticed      map[p2p.NoticeKey]struct{}     // notices already handed to the trainer (each once)
	ownNotices   map[p2p.NoticeKey]p2p.Notice   // our notices, re-sent until the result is published

	// verified holds the digests of announcement encodings whose signature
	// was checked, by step (see verifyOnce).
	verifiedMu sync.Mutex
	verified   map[coordinator.Hash]uint32

	disc   *discovery
	relays *relays
}

type nonceKey struct {
	p2p   coordinator.Pubkey
	nonce uint64
}

// deliveryKey identifies a result independently of its nonce, so that a
// re-announcement is relayed but not delivered twice.
type deliveryKey struct {
	p2p        coordinator.Pubkey
	step       uint32
	batch      p2p.BatchRange
	commitment coordinator.Hash
}

func keyOf(a *p2p.Announcement) deliveryKey {
	return deliveryKey{a.Trainer.P2P, a.Step, a.Batch, a.Commitment}
}

// TopicName is the gossip topic of a run.
func TopicName(runID string) string { return fmt.Sprintf("/psyche/run/%x/announce/1", runID) }

// WithSigner sets the trainer's signer key (its Solana address), which goes
// into every announcement beside the p2p key (default: zero, for tools).
func WithSigner(k coordinator.Pubkey) Option {
	return func(c *config) error {
		c.signer = k
		return c.once("signer")
	}
}

// New starts a host listening on the configured addresses, joins the run's
// topic and starts bitswap. Nothing is delivered until Run is called.
func New(opts ...Option) (*Node, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	key, lk, err := cfg.identity()
	if err != nil {
		return nil, err
	}
	id, err := peer.IDFromPrivateKey(lk)
	if err != nil {
		return nil, err
	}
	gate := newAllowlist(id, cfg.allowAll)
	// A bootstrap address that does not parse is reported by name and
	// skipped: the others, the server and mDNS may still find the peers.
	boot := parseBootstrap(cfg.logger, cfg.bootstrap)
	relays := parseBootstrap(cfg.logger, cfg.relays)
	for _, ai := range append(boot, relays...) {
		gate.addBootstrap(ai.ID)
	}
	tracer := &punchTracer{}
	rm, err := resourceManager()
	if err != nil {
		return nil, err
	}
	hostOpts := []golibp2p.Option{
		rm,
		golibp2p.Identity(lk),
		golibp2p.ListenAddrStrings(cfg.listen...),
		golibp2p.Transport(tcp.NewTCPTransport),
		golibp2p.Transport(quic.NewTransport),
		muxer(),
		security(),
		golibp2p.ConnectionGater(gate),
		// NAT traversal: learn whether we are reachable (AutoNAT v2, asking
		// peers to dial back), keep a reservation on a relay while we are
		// not, and upgrade relayed connections to direct ones by hole
		// punching (DCUtR). Relayed connections are a fallback.
		golibp2p.EnableRelay(),
		golibp2p.EnableAutoNATv2(),
		golibp2p.EnableHolePunching(holepunch.WithTracer(tracer)),
		golibp2p.SwarmOpts(swarm.WithDialRanker(tcpFirst)),
		// Many nodes share a process in tests and benchmarks; the global
		// Prometheus registry is not ours to fill.
		golibp2p.DisableMetrics(),
	}
	if len(cfg.listen) == 0 {
		// Dial out only: reachable through a relay, if any.
		hostOpts = append(hostOpts, golibp2p.NoListenAddrs)
	}
	rl := newRelays(relays)
	if len(relays) > 0 {
		hostOpts = append(hostOpts, golibp2p.AddrsFactory(rl.addrsFactory))
	}
	h, err := golibp2p.New(hostOpts...)
	if err != nil {
		return nil, fmt.Errorf("p2p: host: %w", err)
	}
	n := &Node{
		cfg: cfg, log: cfg.logger.With("peer", id.String()), m: cfg.metrics, key: key, signer: cfg.signer,
		host: h, gate: gate, out: make(chan p2p.Announcement, 4096), notices: make(chan p2p.Notice, 1024),
		noticed: map[p2p.NoticeKey]struct{}{}, ownNotices: map[p2p.NoticeKey]p2p.Notice{},
		clients: map[coordinator.Pubkey]coordinator.ClientID{}, seen: map[nonceKey]uint32{},
		early: map[nonceKey]earlyAnnouncement{}, earlyPer: map[coordinator.Pubkey]int{},
		delivered: map[deliveryKey]struct{}{}, held: map[uint32][][]byte{}, heldKeys: map[deliveryKey]struct{}{},
		own: map[deliveryKey]p2p.Announcement{}, stepRefs: map[uint32][]coordinator.Hash{},
		refs: map[coordinator.Hash]int{}, reports: map[peer.ID]*misconduct{}, rejectLogged: map[rejectKey]bool{},
	}
	n.self, _ = pubkeyOf(id)
	n.relays = rl
	tracer.set(n)
	n.life, n.cancel = context.WithCancel(context.Background())
	if err := n.startDiscovery(append(boot, relays...)); err != nil {
		n.Close()
		return nil, err
	}
	// The peers and paths gauges follow connections as they come and go.
	h.Network().Notify(&network.NotifyBundle{
		ConnectedF:    func(_ network.Network, c network.Conn) { n.onConnected(c) },
		DisconnectedF: func(_ network.Network, c network.Conn) { n.onDisconnected(c) },
	})
	// Nonces start at the clock so that a restarted node never reuses one
	// (its earlier messages may still sit in peers' replay sets).
	n.nonce.Store(uint64(time.Now().UnixNano()))

	if err := n.startGossip(); err != nil {
		n.Close()
		return nil, err
	}
	n.bstore = &servedStore{Blockstore: blockstore.NewBlockstore(dssync.MutexWrap(ds.NewMapDatastore()))}
	n.bs = bitswap.New(n.life, bsnet.NewFromIpfsHost(h), nil, n.bstore,
		bitswap.WithTracer(blockTracer{n}))
	h.SetStreamHandler(p2p.PullProtocol, n.serve(pullTimeout, n.servePull))
	h.SetStreamHandler(p2p.OfferProtocol, n.serve(offerTimeout, n.serveOffer))
	h.SetStreamHandler(p2p.BlobProtocol, n.serveBlob)

	return n, nil
}

// tcpFirst ranks a peer's addresses for dialling: direct TCP ones first,
// then (PublicTCPDelay later) the rest as libp2p's default ranker would
// have them, QUIC first. libp2p prefers QUIC, but results are bulk data and
// quic-go spends several times TCP's CPU per byte (a UDP datagram per
// packet): on a loaded machine a round over QUIC takes about twice as long.
// Hole punching is unaffected: its simultaneous dials use no ranker.
func tcpFirst(addrs []ma.Multiaddr) []network.AddrDelay {
	var tcp, rest []ma.Multiaddr
	for _, a := range addrs {
		if isDirectTCP(a) {
			tcp = append(tcp, a)
		} else {
			rest = append(rest, a)
		}
	}
	if len(tcp) == 0 || len(rest) == 0 {
		return swarm.DefaultDialRanker(addrs)
	}
	out := swarm.DefaultDialRanker(tcp)
	var last time.Duration
	for _, d := range out {
		last = max(last, d.Delay)
	}
	for _, d := range swarm.DefaultDialRanker(rest) {
		d.Delay += last + swarm.PublicTCPDelay
		out = append(out, d)
	}
	return out
}

// isDirectTCP tells a plain TCP address (not relayed, not a websocket).
func isDirectTCP(a ma.Multiaddr) bool {
	tcp, other := false, false
	for _, c := range a {
		switch c.Protocol().Code {
		case ma.P_TCP:
			tcp = true
		case ma.P_CIRCUIT, ma.P_WS, ma.P_WSS, ma.P_TLS, ma.P_SNI, ma.P_HTTP, ma.P_HTTPS:
			other = true
		}
	}
	return tcp && !other
}

// Run delivers announcements and re-announces the node's own until ctx ends,
// then closes the node. Call it once. It returns nil on a clean shutdown. The
// Announcements channel is not closed: select on ctx beside it.
func (n *Node) Run(ctx context.Context) error {
	defer n.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // Close from elsewhere also ends Run
		select {
		case <-n.life.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		n.reannounceLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		n.relayLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		n.discoveryLoop(ctx)
	}()
	err := n.receiveLoop(ctx)
	cancel()
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Close stops the node and its host. It is safe to call more than once.
func (n *Node) Close() error {
	var err error
	n.closed.Do(func() {
		if n.sub != nil {
			n.sub.Cancel()
		}
		if n.topic != nil {
			n.topic.Close()
		}
		if n.bs != nil {
			n.bs.Close()
		}
		n.disc.close()
		n.cancel()
		err = n.host.Close()
		if n.bstore != nil {
			n.bstore.stop()
		}
	})
	return err
}

// alive returns ErrClosed once the node is closed, so that calls after Close
// fail with one recognisable error instead of whatever libp2p says.
func (n *Node) alive() error {
	if n.life.Err() != nil {
		return p2p.ErrClosed
	}
	return nil
}

// ID is this node's p2p key.
func (n *Node) ID() coordinator.Pubkey { return n.self }

// Addrs lists the node's listen addresses with its /p2p/ id appended.
func (n *Node) Addrs() []string { return hostAddrs(n.host) }

// hostAddrs lists h's listen addresses with its /p2p/ id appended.
func hostAddrs(h host.Host) []string {
	ais, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()})
	if err != nil {
		return nil
	}
	out := make([]string, len(ais))
	for i, a := range ais {
		out[i] = a.String()
	}
	return out
}

func parseAddr(s string) (peer.AddrInfo, error) {
	m, err := ma.NewMultiaddr(s)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("%w: %q: %v", p2p.ErrBadAddress, s, err)
	}
	ai, err := peer.AddrInfoFromP2pAddr(m)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("%w: %q: %v", p2p.ErrBadAddress, s, err)
	}
	return *ai, nil
}

// AddrKey returns the p2p key named by addr, a multiaddr ending in
// /p2p/<id> of an ed25519 identity.
func (*Node) AddrKey(addr string) (coordinator.Pubkey, error) { return AddrKey(addr) }

// AddrKey returns the p2p key named by addr, a multiaddr ending in
// /p2p/<id> of an ed25519 identity.
func AddrKey(addr string) (coordinator.Pubkey, error) {
	ai, err := parseAddr(addr)
	if err != nil {
		return coordinator.Pubkey{}, err
	}
	k, ok := pubkeyOf(ai.ID)
	if !ok {
		return k, fmt.Errorf("%w: %q: not an ed25519 identity", p2p.ErrBadAddress, addr)
	}
	return k, nil
}

// Connect dials addr (a multiaddr ending in /p2p/<id>). The peer must be
// allowed by the allowlist on both sides.
func (n *Node) Connect(ctx context.Context, addr string) error {
	ai, err := parseAddr(addr)
	if err != nil {
		return err
	}
	// An explicit connect skips the swarm's dial backoff: trainers dial
	// each other before the coordinator lists them (and the allowlist admits
	// them), and the backoff of those refused dials would otherwise delay
	// the retry that succeeds by many seconds.
	ctx = network.WithForceDirectDial(ctx, "psyche: explicit connect")
	for attempt := 1; ; attempt++ {
		err = n.host.Connect(ctx, ai)
		if err == nil || n.host.Network().Connectedness(ai.ID) == network.Connected {
			return nil
		}
		// Two nodes that dial each other at once from their listening
		// ports (TCP port reuse, which hole punching needs) can meet in one
		// TCP simultaneous open where both sides start the security
		// handshake as its initiator, and both dials fail. The peer is
		// reachable; a later dial, not at the same instant, gets through.
		// Only that failure is retried: a refused or unreachable peer is
		// retried by the caller's own schedule.
		if attempt == connectAttempts || ctx.Err() != nil || !strings.Contains(err.Error(), "failed to negotiate security protocol") {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * connectRetryPause):
		}
	}
}

// connectAttempts and connectRetryPause bound Connect's retries after a
// failed dial (see Connect).
const (
	connectAttempts   = 3
	connectRetryPause = 100 * time.Millisecond
)

// Peers lists the p2p keys of connected peers.
func (n *Node) Peers() []coordinator.Pubkey {
	var out []coordinator.Pubkey
	for _, p := range n.host.Network().Peers() {
		if k, ok := pubkeyOf(p); ok {
			out = append(out, k)
		}
	}
	return out
}

// SetClients replaces the allowlist with the epoch's clients and closes
// connections to peers that are no longer allowed. Whether the node is on
// it (a member of its run) is whom a server's relay admits: becoming one
// makes a refused reservation be asked for again at once.
func (n *Node) SetClients(ids []coordinator.ClientID) {
	pids := make([]peer.ID, 0, len(ids))
	clients := make(map[coordinator.Pubkey]coordinator.ClientID, len(ids))
	for _, id := range ids {
		clients[id.P2P] = id
		if p, err := peerIDOf(id.P2P); err == nil {
			pids = append(pids, p)
		}
	}
	n.mu.Lock()
	n.clients = clients
	n.mu.Unlock()
	_, member := clients[n.self]
	n.relays.setMember(member)
	for _, p := range n.gate.setClients(pids) {
		n.log.Debug("peer left the allowlist", "remote", p.String())
		_ = n.host.Network().ClosePeer(p)
	}
}

// SetMaxPayload sets the largest result blob the run allows (Fetch refuses
// larger ones).
func (n *Node) SetMaxPayload(bytes int64) { n.maxPayload.Store(bytes) }

// SetAssignments replaces the batches announcements are checked against.
func (n *Node) SetAssignments(as []p2p.Assignment) {
	m := p2p.IndexAssignments(as)
	n.mu.Lock()
	n.assignments = m
	n.views.Add(1)
	n.mu.Unlock()
	n.releaseEarly()
}

// SetStep sets the coordinator's current step: the validator accepts
// announcements for [step-2, step+1], and everything older is forgotten,
// blobs included.
func (n *Node) SetStep(step uint32) {
	n.step.Store(step)
	if step < 3 {
		return
	}
	oldest := step - 2
	n.mu.Lock()
	var drop []coordinator.Hash
	for s, hs := range n.stepRefs {
		if s < oldest {
			drop = append(drop, n.unref(hs)...)
			delete(n.stepRefs, s)
		}
	}
	for k, s := range n.seen {
		if s < oldest {
			delete(n.seen, k)
		}
	}
	for k := range n.delivered {
		if k.step < oldest {
			delete(n.delivered, k)
		}
	}
	for k := range n.heldKeys {
		if k.step < oldest {
			delete(n.heldKeys, k)
		}
	}
	for s := range n.held {
		if s < oldest {
			delete(n.held, s)
		}
	}
	for k := range n.own {
		if k.step < oldest {
			delete(n.own, k)
		}
	}
	for k := range n.noticed {
		if k.Step < oldest {
			delete(n.noticed, k)
		}
	}
	for k := range n.ownNotices {
		if k.Step < step {
			delete(n.ownNotices, k) // its round is over: nobody waits for it now
		}
	}
	n.mu.Unlock()
	n.deleteBlocks(drop)
}

// Stats reads the node's metrics back (they are counted once, there).
func (n *Node) Stats() p2p.Stats { return n.m.stats() }

func (n *Node) peerError(k coordinator.Pubkey, why string, err error) {
	n.m.PeerErrors.WithLabelValues(k.String()).Inc()
	n.log.Debug("peer error", "remote", fmt.Sprintf("%x", k[:8]), "why", why, "err", err)
}

// blockTracer attributes received bitswap blocks to the peer that sent them.
type blockTracer struct{ n *Node }

func (t blockTracer) MessageReceived(p peer.ID, m bsmsg.BitSwapMessage) {
	if b := len(m.Blocks()); b > 0 {
		if k, ok := pubkeyOf(p); ok {
			t.n.m.BlocksFrom.WithLabelValues(k.String()).Add(float64(b))
		}
	}
}
func (blockTracer) MessageSent(peer.ID, bsmsg.BitSwapMessage) {}
