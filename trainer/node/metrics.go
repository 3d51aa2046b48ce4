package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/promread"
)

// Metrics is what the node counts, each thing once: Progress reads these
// collectors back. NewMetrics registers them; the default (WithMetrics not
// given) is a set nobody registers.
type Metrics struct {
	Epoch, Step, State prometheus.Gauge   // where the run is, as this node last saw it
	Loss               prometheus.Gauge   // loss of the last batch this node trained
	Steps              prometheus.Counter // batches trained
	Tokens             prometheus.Counter // tokens trained
	SentBytes          prometheus.Counter // result bytes published
	ReceivedBytes      prometheus.Counter // peers' result bytes fetched and accepted
	RoundsApplied      prometheus.Counter // rounds whose consensus results were applied
	ResultsApplied     prometheus.Counter // results applied, over all rounds
	ResultsMissing     prometheus.Counter // consensus results not applied: never arrived, or refused (their trainer equivocated); the model then differs
	WitnessReports     prometheus.Counter // witness and warmup witness reports sent
	Ticks              prometheus.Counter // tick instructions sent (WithTicking)
	ComputeSeconds     prometheus.Counter // training and applying; the rest of a round is coordination and networking
	AheadTrained       prometheus.Counter // gradients trained ahead for the next round (while this one was witnessed)
	AheadReused        prometheus.Counter // of those, published: the round started as guessed
	ResultsRefused     prometheus.Counter // results refused as copies or replays of results seen before
	Verifications      prometheus.Counter // sampled results this witness scored (verification_percent)
	VerifySeconds      prometheus.Counter // of ComputeSeconds, the scoring's
}

// NewMetrics returns a node's metrics under psyche_*, registered with reg
// (nil: not registered). One Metrics serves one node.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "psyche", Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psyche", Name: name, Help: help})
	}
	m := &Metrics{
		Epoch:          gauge("epoch", "Current epoch of the run."),
		Step:           gauge("step", "Current step of the run."),
		State:          gauge("run_state", "Run state (0 Uninitialized, 1 WaitingForMembers, 2 Warmup, 3 RoundTrain, 4 RoundWitness, 5 Cooldown, 6 Finished, 7 Paused)."),
		Loss:           gauge("loss", "Loss of the last batch this trainer trained."),
		Steps:          counter("steps_trained_total", "Batches this trainer trained."),
		Tokens:         counter("tokens_total", "Tokens trained by this trainer."),
		SentBytes:      counter("result_bytes_sent_total", "Bytes of results published."),
		ReceivedBytes:  counter("result_bytes_received_total", "Bytes of peers' results fetched and accepted."),
		RoundsApplied:  counter("rounds_applied_total", "Rounds whose consensus results were applied."),
		ResultsApplied: counter("results_applied_total", "Consensus results applied, over all rounds."),
		ResultsMissing: counter("results_missing_total", "Consensus results that never arrived before the epoch ended."),
		WitnessReports: counter("witness_reports_total", "Witness reports sent."),
		Ticks:          counter("ticks_sent_total", "Tick instructions sent (trainers tick Solana runs)."),
		ComputeSeconds: counter("compute_seconds_total", "Time spent training batches and applying rounds (the rest of a round is coordination and networking)."),
		AheadTrained:   counter("ahead_trained_total", "Batches trained ahead, before their round started."),
		AheadReused:    counter("ahead_reused_total", "Batches trained ahead and published: their round started as guessed."),
		ResultsRefused: counter("results_refused_total", "Results refused because another trainer sent them first, or their trainer did at an earlier step, or because their trainer's verification scores failed."),
		Verifications:  counter("verifications_total", "Sampled results this witness scored (verification_percent)."),
		VerifySeconds:  counter("verify_seconds_total", "Time spent scoring sampled results (part of compute_seconds_total)."),
	}
	if reg != nil {
		reg.MustRegister(m.Epoch, m.Step, m.State, m.Loss, m.Steps, m.Tokens, m.SentBytes, m.ReceivedBytes,
			m.RoundsApplied, m.ResultsApplied, m.ResultsMissing, m.WitnessReports, m.Ticks, m.ComputeSeconds, m.AheadTrained, m.AheadReused, m.ResultsRefused,
			m.Verifications, m.VerifySeconds)
	}
	return m
}

// WithMetrics sets the node's metrics (see NewMetrics).
func WithMetrics(m *Metrics) Option {
	return func(c *config) error { c.metrics = m; return nil }
}

// progress reads the metrics back as a Progress.
func (m *Metrics) progress() Progress {
	u := func(c prometheus.Metric) uint64 { return uint64(promread.Value(c)) }
	return Progress{State: coordinator.RunState(promread.Value(m.State)), Epoch: uint32(promread.Value(m.Epoch)),
		Step: uint32(promread.Value(m.Step)), Loss: float32(promread.Value(m.Loss)), Tokens: u(m.Tokens),
		Sent: u(m.SentBytes), Received: u(m.ReceivedBytes), Applied: u(m.RoundsApplied), Witnessed: u(m.WitnessReports),
		Compute: time.Duration(promread.Value(m.ComputeSeconds) * float64(time.Second)),
		Verify:  time.Duration(promread.Value(m.VerifySeconds) * float64(time.Second)), Verified: u(m.Verifications)}
}
