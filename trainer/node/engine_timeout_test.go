package node

import (
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// A round's computation may take twice the training limit, at least a
// minute, and at least what the round's batch takes at slowestFLOPs: a
// 0.5B model's round of 2 × 128 tokens is 759 G FLOPs, 12.6 minutes.
func TestEngineTimeout(t *testing.T) {
	small := llama.Config{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 176, RopeTheta: 10000}
	big := llama.Config{Vocab: 151936, Context: 128, Width: 896, Layers: 24, Heads: 14, KVHeads: 2, Intermediate: 4864,
		RopeTheta: 1e6, TiedHead: true}
	run := func(c llama.Config, trainLimit uint64, batch uint16) *coordinator.Coordinator {
		s := &coordinator.Coordinator{}
		modelspec.SetLlama(&s.Model, c)
		s.Config.MaxRoundTrainTime, s.Config.GlobalBatchSizeEnd = trainLimit, batch
		return s
	}
	bigSecs := 6 * float64(big.NumParams()) * 2 * 128 / slowestFLOPs
	for _, c := range []struct {
		name string
		s    *coordinator.Coordinator
		want time.Duration
	}{
		{"a small model: a minute", run(small, 7, 8), time.Minute},
		{"a small model, a long training limit: twice it", run(small, 100, 8), 200 * time.Second},
		{"a 0.5B model: its batch at the slowest rate", run(big, 30, 2), time.Duration(bigSecs * float64(time.Second))},
	} {
		if got := engineTimeout(c.s); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if bigSecs < 700 || bigSecs > 800 {
		t.Errorf("the 0.5B model's round takes %.0f s at the slowest rate, want about 759", bigSecs)
	}
}
