package promread

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestReadsWhatWasCounted(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "v"}, []string{"reason"})
	c.Add(3)
	g.Set(-1.5)
	v.WithLabelValues("a").Add(2)
	v.WithLabelValues("b").Inc()
	v.WithLabelValues("a").Inc()
	if Value(c) != 3 || Value(g) != -1.5 {
		t.Fatalf("counter %v, gauge %v", Value(c), Value(g))
	}
	got := ByLabel(v, "reason")
	if len(got) != 2 || got["a"] != 3 || got["b"] != 1 {
		t.Fatalf("ByLabel = %v", got)
	}
	if len(ByLabel(v, "other")) != 0 {
		t.Fatal("a label the vector lacks has values")
	}
}
