// Package promread reads the current values of Prometheus collectors, so a
// package can count each thing once (in its Metrics) and still report the
// counts itself (Stats, Progress) without keeping a second set.
package promread

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value is the value of a single counter or gauge (0 for anything else).
func Value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

// ByLabel is the value of each child of a counter or gauge vector, by the
// value of its label (the vector must have exactly that one label).
func ByLabel(c prometheus.Collector, label string) map[string]float64 {
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			continue
		}
		for _, l := range d.Label {
			if l.GetName() == label {
				out[l.GetValue()] += Value(m)
			}
		}
	}
	return out
}
