package llama

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/psyche-go/psyche/trainer/internal/modeltest"
	"github.com/psyche-go/psyche/trainer/kernels"
)

// Model sizes for the step benchmarks: about 10M and 50M parameters, with
// grouped-query attention, a tied head and the byte vocabulary, so the
// blocks, not the embeddings, hold the parameters.
var benchConfigs = []struct {
	name string
	cfg  Config
}{
	{"10M", Config{Vocab: 256, Context: 128, Width: 384, Layers: 6, Heads: 6, KVHeads: 2, Intermediate: 1024, RopeTheta: 10000, TiedHead: true}},
	{"50M", Config{Vocab: 256, Context: 128, Width: 640, Layers: 11, Heads: 10, KVHeads: 5, Intermediate: 1728, RopeTheta: 10000, TiedHead: true}},
}

// matmulRate measures the backend's Gemm in GFLOP/s on the step's largest
// product shape (the MLP's input projection: b·t rows, width in, 2·I out),
// so a step's rate can be given as a fraction of what the matrix products
// alone reach on this machine, in this run: the best of three trials of at
// least 200 ms each, which makes the fraction conservative.
func matmulRate(be kernels.Backend, rows, in, out int) float64 {
	return kernels.GemmRate(be, rows, in, out, 3, 200*time.Millisecond)
}

// BenchmarkStep is one forward and backward pass over 4 sequences of 128
// tokens on the kernels this binary was built with, reported as tokens/s,
// GFLOP/s and that rate as a fraction of the measured matmul rate.
func BenchmarkStep(b *testing.B) {
	for _, bc := range benchConfigs {
		b.Run(fmt.Sprintf("%s/%s", bc.name, kernels.Default().Name()), func(b *testing.B) {
			m, err := New(bc.cfg, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			const bs, t = 4, 128
			in, tg := modeltest.Batch(rand.New(rand.NewPCG(1, 1)), bs, t, bc.cfg.Vocab)
			mm := matmulRate(m.Backend(), bs*t, bc.cfg.Width, 2*bc.cfg.Intermediate)
			b.ResetTimer()
			modeltest.Steps(b, m, in, tg, bs, t)
			sec := b.Elapsed().Seconds() / float64(b.N)
			// Measured again after the steps, in case the machine got
			// quieter: the fraction is against the best seen.
			mm = max(mm, matmulRate(m.Backend(), bs*t, bc.cfg.Width, 2*bc.cfg.Intermediate))
			gflops := bc.cfg.FLOPsPerToken(t) * bs * t / sec / 1e9
			b.ReportMetric(float64(bs*t)/sec, "tokens/s")
			b.ReportMetric(gflops, "GFLOP/s")
			b.ReportMetric(mm, "matmul-GFLOP/s")
			b.ReportMetric(gflops/mm, "of-matmul")
			b.ReportMetric(float64(bc.cfg.NumParams())/1e6, "Mparams")
		})
	}
}
