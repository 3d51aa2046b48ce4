package server

import "github.com/prometheus/client_golang/prometheus"

// Metrics is what the server counts. NewMetrics registers them; the default
// (WithMetrics not given) is a set nobody registers.
type Metrics struct {
	// Requests counts requests by instruction and outcome ("ok", or the
	// failure's name: Replay, RunNotFound, BadRequest, a coordinator error).
	Requests    *prometheus.CounterVec
	Transitions prometheus.Counter // state changes made by the server's ticks
	Runs        prometheus.Gauge   // runs the server holds
	Subscribers prometheus.Gauge   // open snapshot streams
	// SlowSubscribers counts streams dropped because one event took
	// longer than the slow-subscriber timeout to write.
	SlowSubscribers prometheus.Counter
	// ShedSubscribers counts streams closed to make room for a stream of
	// an address group that held fewer (WithSubscriberLimits).
	ShedSubscribers prometheus.Counter
	Quarantined     prometheus.Gauge   // runs whose state file could not be trusted at start
	EventBytes      prometheus.Counter // bytes of snapshot events written (whole accounts and deltas)
}

// NewMetrics returns the server's metrics under psyche_server_*,
// registered with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "server", Name: "requests_total",
			Help: "Signed requests, by instruction and outcome."}, []string{"instruction", "outcome"}),
		Transitions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "server", Name: "tick_transitions_total",
			Help: "State changes made by the server's ticks."}),
		Runs:        prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "psyche", Subsystem: "server", Name: "runs", Help: "Runs the server holds."}),
		Subscribers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "psyche", Subsystem: "server", Name: "subscribers", Help: "Open snapshot streams."}),
		SlowSubscribers: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "server", Name: "slow_subscribers_dropped_total",
			Help: "Snapshot streams dropped because their client stopped reading."}),
		ShedSubscribers: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "server", Name: "shed_subscribers_total",
			Help: "Snapshot streams closed to make room for one from an address group that held fewer."}),
		Quarantined: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "psyche", Subsystem: "server", Name: "quarantined_runs",
			Help: "Runs not served because their state file could not be trusted."}),
		EventBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "server", Name: "event_bytes_total",
			Help: "Bytes of snapshot events written to subscribers (whole accounts and deltas)."}),
	}
	if reg != nil {
		reg.MustRegister(m.Requests, m.Transitions, m.Runs, m.Subscribers, m.SlowSubscribers, m.ShedSubscribers, m.Quarantined, m.EventBytes)
	}
	return m
}

// WithMetrics sets the server's metrics (see NewMetrics).
func WithMetrics(m *Metrics) Option {
	return func(c *config) error { c.metrics = m; return nil }
}
