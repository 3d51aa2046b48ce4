package p2p

// Counter and Histogram are the instruments the package reports to, shaped
// like go-kit's so that a Prometheus (or any other) adapter is a few lines
// in cmd/. With returns the instrument for a label set (key, value pairs).
type Counter interface {
	With(labelValues ...string) Counter
	Add(delta float64)
}

// Histogram records observations such as durations in seconds.
type Histogram interface {
	With(labelValues ...string) Histogram
	Observe(value float64)
}

// Metrics is injected with WithMetrics; the default discards everything.
// Stats() keeps its own counters regardless, for tests and status output.
type Metrics struct {
	Published   Counter // own announcements gossiped
	Reannounced Counter // re-sends of own announcements
	Accepted    Counter // announcements that passed validation
	Rejected    Counter // label "reason": bad_signature, wrong_run, step_window, not_assigned, oversize, malformed, replayed
	Delivered   Counter // announcements handed to the trainer (including those then dropped)
	Dropped     Counter // announcements lost to a full Announcements channel

	BlobsFetched     Counter
	BlobBytes        Counter   // payload bytes fetched
	FetchSeconds     Histogram // successful blob fetches, end to end
	FetchRetries     Counter
	FetchFailures    Counter
	PeerErrors       Counter // failures attributed to a peer
	CheckpointBlocks Counter // checkpoint blocks fetched and verified
}

type nopCounter struct{}

func (nopCounter) With(...string) Counter { return nopCounter{} }
func (nopCounter) Add(float64)            {}

type nopHistogram struct{}

func (nopHistogram) With(...string) Histogram { return nopHistogram{} }
func (nopHistogram) Observe(float64)          {}

// NopMetrics returns metrics that record nothing.
func NopMetrics() *Metrics {
	c, h := nopCounter{}, nopHistogram{}
	return &Metrics{Published: c, Reannounced: c, Accepted: c, Rejected: c, Delivered: c, Dropped: c,
		BlobsFetched: c, BlobBytes: c, FetchSeconds: h, FetchRetries: c, FetchFailures: c, PeerErrors: c,
		CheckpointBlocks: c}
}

// WithMetrics sets where the node reports. Nil fields are filled with no-ops.
func WithMetrics(m *Metrics) Option {
	return func(c *config) error {
		full := *m
		nop := NopMetrics()
		fillCounter(&full.Published, nop.Published)
		fillCounter(&full.Reannounced, nop.Reannounced)
		fillCounter(&full.Accepted, nop.Accepted)
		fillCounter(&full.Rejected, nop.Rejected)
		fillCounter(&full.Delivered, nop.Delivered)
		fillCounter(&full.Dropped, nop.Dropped)
		fillCounter(&full.BlobsFetched, nop.BlobsFetched)
		fillCounter(&full.BlobBytes, nop.BlobBytes)
		fillCounter(&full.FetchRetries, nop.FetchRetries)
		fillCounter(&full.FetchFailures, nop.FetchFailures)
		fillCounter(&full.PeerErrors, nop.PeerErrors)
		fillCounter(&full.CheckpointBlocks, nop.CheckpointBlocks)
		if full.FetchSeconds == nil {
			full.FetchSeconds = nop.FetchSeconds
		}
		c.metrics = &full
		return c.once("metrics")
	}
}

func fillCounter(dst *Counter, nop Counter) {
	if *dst == nil {
		*dst = nop
	}
}
