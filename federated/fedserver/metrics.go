package fedserver

import "github.com/prometheus/client_golang/prometheus"

// Metrics is what the federated service counts (psyche_federated_*).
type Metrics struct {
	Updates  *prometheus.CounterVec // by run and outcome (ok or the failure's name)
	Round    *prometheus.GaugeVec   // by run
	Buffered *prometheus.GaugeVec   // by run
	Epsilon  *prometheus.GaugeVec   // central ε so far, by run (absent without DP)
	// Written counts the bytes written to runs' state files and join
	// journals, by run and kind ("state", "journal").
	Written *prometheus.CounterVec
	// Quarantined counts the runs whose state file could not be read at
	// start: served to nobody, never overwritten.
	Quarantined prometheus.Gauge
}

// NewMetrics returns the metrics, registered with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	opts := func(name, help string) prometheus.GaugeOpts {
		return prometheus.GaugeOpts{Namespace: "psyche", Subsystem: "federated", Name: name, Help: help}
	}
	m := &Metrics{
		Updates: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "federated", Name: "updates_total",
			Help: "Federated updates, by run and outcome."}, []string{"run", "outcome"}),
		Round:    prometheus.NewGaugeVec(opts("round", "The model's round (aggregations done)."), []string{"run"}),
		Buffered: prometheus.NewGaugeVec(opts("buffered", "Updates waiting in the buffer."), []string{"run"}),
		Epsilon:  prometheus.NewGaugeVec(opts("epsilon", "Central differential privacy spent so far (ε at the run's δ)."), []string{"run"}),
		Written: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psyche", Subsystem: "federated", Name: "state_bytes_written_total",
			Help: "Bytes written to federated runs' state files (kind state) and join journals (kind journal), by run."}, []string{"run", "kind"}),
		Quarantined: prometheus.NewGauge(opts("quarantined_runs",
			"Federated runs whose state file could not be trusted at start: not served, left as they are.")),
	}
	if reg != nil {
		reg.MustRegister(m.Updates, m.Round, m.Buffered, m.Epsilon, m.Written, m.Quarantined)
	}
	return m
}
