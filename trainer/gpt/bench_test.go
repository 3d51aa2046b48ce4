package gpt

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/psyche-go/psyche/trainer/internal/modeltest"
)

// Model sizes for the step benchmarks: about 1M and 10M parameters.
var benchConfigs = []struct {
	name string
	cfg  Config
}{
	{"1M", Config{Vocab: 256, Context: 128, Width: 128, Layers: 4, Heads: 4}},
	{"10M", Config{Vocab: 256, Context: 128, Width: 256, Layers: 12, Heads: 8}},
}

// BenchmarkStep is one forward and backward pass over 4 sequences of 128
// tokens, on the kernels this binary was built with.
func BenchmarkStep(b *testing.B) {
	for _, bc := range benchConfigs {
		b.Run(fmt.Sprintf("%s/%s", bc.name, backendName()), func(b *testing.B) {
			m, err := New(bc.cfg, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			const bs, t = 4, 128
			in, tg := modeltest.Batch(rand.New(rand.NewPCG(1, 1)), bs, t, bc.cfg.Vocab)
			modeltest.Steps(b, m, in, tg, bs, t)
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(float64(bs*t)/sec, "tokens/s")
			b.ReportMetric(bc.cfg.FLOPsPerToken(t)*bs*t/sec/1e9, "GFLOP/s")
			b.ReportMetric(float64(bc.cfg.NumParams())/1e6, "Mparams")
		})
	}
}

func backendName() string { n, _ := New(tiny, 1, nil); return n.Backend().Name() }
