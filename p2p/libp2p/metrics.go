package libp2p

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/promread"
	"github.com/psyche-go/psyche/p2p"
)

// Metrics is what the node counts, each thing once: Stats reads these
// collectors back. NewMetrics registers them; the default (WithMetrics not
// given) is a set nobody registers, which costs a few atomic adds.
type Metrics struct {
	Published   prometheus.Counter     // own announcements gossiped
	Reannounced prometheus.Counter     // re-sends of own announcements
	Accepted    prometheus.Counter     // announcements that passed validation (gossip and pull)
	Rejected    *prometheus.CounterVec // label "reason": bad_signature, wrong_run, step_window, not_assigned, oversize, malformed, replayed
	// NoticesRejected counts refused training notices, by the same reasons.
	NoticesRejected *prometheus.CounterVec
	Delivered       prometheus.Counter // announcements handed to the trainer (including those then dropped)
	Dropped         prometheus.Counter // announcements lost to a full Announcements channel
	Early           prometheus.Counter // announcements kept until the view reached their round (holdEarly)

	BlobsFetched     prometheus.Counter
	BlobBytes        prometheus.Counter   // payload bytes fetched
	FetchSeconds     prometheus.Histogram // successful blob fetches, end to end
	FetchRetries     prometheus.Counter
	FetchFailures    prometheus.Counter
	CheckpointBlocks prometheus.Counter     // checkpoint blocks fetched and verified
	PeerErrors       *prometheus.CounterVec // label "peer": failures attributed to a peer (base58 key)
	BlocksFrom       *prometheus.CounterVec // label "peer": blob blocks received from it (stream or bitswap)
	Peers            prometheus.Gauge       // connected peers
	Paths            *prometheus.GaugeVec   // label "path": connected peers by their best path (direct, hole-punched, relayed)
	Reported         *prometheus.CounterVec // label "why": the trainer's reports of peer misconduct
}

// NewMetrics returns the node's metrics under psyche_p2p_*, registered with
// reg (nil: not registered). One Metrics serves one node.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "p2p", Name: name, Help: help})
	}
	vec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "p2p", Name: name, Help: help}, []string{label})
	}
	m := &Metrics{
		Published:        counter("announcements_published_total", "Own announcements gossiped."),
		Reannounced:      counter("announcements_reannounced_total", "Re-sends of own announcements."),
		Accepted:         counter("announcements_accepted_total", "Announcements that passed validation (gossip and pull)."),
		Rejected:         vec("announcements_rejected_total", "Announcements refused, by reason.", "reason"),
		NoticesRejected:  vec("notices_rejected_total", "Training notices refused, by reason.", "reason"),
		Delivered:        counter("announcements_delivered_total", "Peers' announcements handed to the trainer."),
		Dropped:          counter("announcements_dropped_total", "Announcements lost because the trainer did not take them in time."),
		Early:            counter("announcements_early_total", "Announcements for the next round kept until this node's view of the run reached it."),
		BlobsFetched:     counter("blobs_fetched_total", "Result blobs fetched and verified."),
		BlobBytes:        counter("blob_bytes_total", "Bytes of result blobs fetched."),
		FetchSeconds:     prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psyche", Subsystem: "p2p", Name: "fetch_seconds", Help: "Time to fetch a result blob, end to end.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
		FetchRetries:     counter("fetch_retries_total", "Blob and block fetch attempts that were retried."),
		FetchFailures:    counter("fetch_failures_total", "Fetches that gave up."),
		CheckpointBlocks: counter("checkpoint_blocks_total", "Checkpoint blocks fetched and verified."),
		PeerErrors:       vec("peer_errors_total", "Failures attributed to a peer.", "peer"),
		BlocksFrom:       vec("blocks_received_total", "Blob blocks received and verified (blob stream or bitswap), by peer.", "peer"),
		Peers:            prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "psyche", Subsystem: "p2p", Name: "peers", Help: "Connected peers."}),
		Paths: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "psyche", Subsystem: "p2p", Name: "peer_paths",
			Help: "Connected peers by the best path they are reached on: direct, hole-punched or relayed."}, []string{"path"}),
		Reported: vec("peers_reported_total", "Peer misconduct the trainer found (a bad result, equivocation), by kind.", "why"),
	}
	if reg != nil {
		reg.MustRegister(m.Published, m.Reannounced, m.Accepted, m.Rejected, m.NoticesRejected, m.Delivered, m.Dropped, m.Early, m.BlobsFetched,
			m.BlobBytes, m.FetchSeconds, m.FetchRetries, m.FetchFailures, m.CheckpointBlocks, m.PeerErrors, m.BlocksFrom, m.Peers, m.Paths, m.Reported)
	}
	return m
}

// WithMetrics sets the node's metrics (see NewMetrics).
func WithMetrics(m *Metrics) Option {
	return func(c *config) error {
		c.metrics = m
		return c.once("metrics")
	}
}

// stats reads the counters back.
func (m *Metrics) stats() p2p.Stats {
	u := func(c prometheus.Metric) uint64 { return uint64(promread.Value(c)) }
	s := p2p.Stats{Published: u(m.Published), Reannounced: u(m.Reannounced), Accepted: u(m.Accepted), Delivered: u(m.Delivered),
		Dropped: u(m.Dropped), Early: u(m.Early), BlobsFetched: u(m.BlobsFetched), FetchRetries: u(m.FetchRetries), FetchFailures: u(m.FetchFailures),
		CheckpointBlocks: u(m.CheckpointBlocks), Rejected: map[string]uint64{}, NoticesRejected: map[string]uint64{},
		PeerErrors: map[coordinator.Pubkey]uint64{}, BlocksFrom: map[coordinator.Pubkey]uint64{}}
	for r, v := range promread.ByLabel(m.Rejected, "reason") {
		s.Rejected[r] = uint64(v)
	}
	for r, v := range promread.ByLabel(m.NoticesRejected, "reason") {
		s.NoticesRejected[r] = uint64(v)
	}
	byPeer := func(vec *prometheus.CounterVec, into map[coordinator.Pubkey]uint64) {
		for p, v := range promread.ByLabel(vec, "peer") {
			if k, err := coordinator.ParsePubkey(p); err == nil {
				into[k] = uint64(v)
			}
		}
	}
	byPeer(m.PeerErrors, s.PeerErrors)
	byPeer(m.BlocksFrom, s.BlocksFrom)
	return s
}
