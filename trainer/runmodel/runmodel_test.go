package runmodel

import (
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

var small = gpt.Config{Vocab: 256, Context: 128, Width: 64, Layers: 2, Heads: 4}

func runModel() coordinator.Model {
	m := coordinator.Model{Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, ClipGradNorm: 1,
		WeightDecay: 0.1, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64, Quantize1Bit: true}}
	modelspec.SetGPT(&m, small)
	return m
}

var smallLlama = llama.Config{Vocab: 256, Context: 128, Width: 64, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 160, RopeTheta: 500000, TiedHead: true}

// TestLlamaRoundTrip: a Llama run model builds the model of the config it
// was set from (modelspec's tests check the config itself).
func TestLlamaRoundTrip(t *testing.T) {
	var m coordinator.Model
	modelspec.SetLlama(&m, smallLlama)
	c, err := modelspec.ModelConfig(&m)
	if err != nil {
		t.Fatal(err)
	}
	model, err := New(c, 1, nil)
	if got, _ := ConfigOf(model); err != nil || got != c || model.NumParams() != smallLlama.NumParams() {
		t.Fatalf("New = %v, %v", model, err)
	}
}
