package modelspec

import (
	"errors"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
)

var small = GPTConfig{Vocab: 256, Context: 128, Width: 64, Layers: 2, Heads: 4}

func runModel() coordinator.Model {
	m := coordinator.Model{Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, ClipGradNorm: 1,
		WeightDecay: 0.1, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64, Quantize1Bit: true}}
	SetGPT(&m, small)
	return m
}

func TestGPTRoundTrip(t *testing.T) {
	m := runModel()
	if m.Architecture != coordinator.ArchGPT || m.VocabSize != 256 || m.MaxSeqLen != 128 || m.DModel != 64 || m.NLayers != 2 || m.NHeads != 4 {
		t.Fatalf("SetGPT wrote %+v", m)
	}
	got, err := GPT(&m)
	if err != nil || got != small {
		t.Fatalf("GPT = %+v, %v; want %+v", got, err, small)
	}
	if err := Check(Config{Arch: coordinator.ArchGPT, GPT: small}, &m); err != nil {
		t.Fatalf("Check against its own run: %v", err)
	}
	// The run model's shape rules and the network's agree: a model the
	// coordinator accepts is one this package can build.
	m.DataKind, m.TokenSize = coordinator.DataLocal, 2
	m.Checkpoint.Kind = coordinator.CheckpointHub
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "file:///x")
	_ = coordinator.SetFixedString(m.DataLocation[:], "/x")
	m.LR = coordinator.LRSchedule{Kind: coordinator.LRConstant, BaseLR: 1e-3}
	if err := m.Validate(); err != nil {
		t.Fatalf("the coordinator refuses the model SetGPT described: %v", err)
	}
}

func TestGPTRejects(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*coordinator.Model)
		want error
		text string
	}{
		{"no architecture", func(m *coordinator.Model) { m.Architecture = coordinator.ArchNone }, ErrArchitecture, "architecture: 0"},
		{"unknown architecture", func(m *coordinator.Model) { m.Architecture = 9 }, ErrArchitecture, "architecture: 9"},
		{"no vocab", func(m *coordinator.Model) { m.VocabSize = 0 }, nil, "must be positive"},
		{"heads", func(m *coordinator.Model) { m.NHeads = 5 }, nil, "heads (5) must divide width (64)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := runModel()
			tt.edit(&m)
			_, err := GPT(&m)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("GPT = %v, want %v with %q", err, tt.want, tt.text)
			}
		})
	}
}

func TestDistro(t *testing.T) {
	m := runModel()
	got, err := Distro(&m, 3)
	want := distro.Options{Chunk: 64, TopK: 12, Quantize1Bit: true, RiceIndices: true, Decay: 0.97, WeightDecay: 0.1, ClipGradNorm: 1, NormalizeRMS: true, Workers: 3}
	if err != nil || got != want {
		t.Fatalf("Distro = %+v, %v; want %+v", got, err, want)
	}
	// The options build an optimizer for the network the run describes.
	cfg, _ := GPT(&m)
	if _, err := distro.NewDeMo(cfg.Shapes(), got); err != nil {
		t.Fatalf("the run's DisTrO options build no optimizer: %v", err)
	}
	m.Optimizer.Kind = coordinator.OptimizerAdamW
	if _, err := Distro(&m, 1); !errors.Is(err, ErrOptimizer) {
		t.Fatalf("Distro with AdamW = %v, want ErrOptimizer", err)
	}
}

// TestDistroAggregation: the run's aggregation rule reaches the optimizer,
// the zero value being the robust rule, and an unknown one is an error.
func TestDistroAggregation(t *testing.T) {
	for from, want := range map[coordinator.Aggregation]distro.Aggregation{
		coordinator.AggregationRobust:      distro.AggregateRobust,
		coordinator.AggregationMean:        distro.AggregateMean,
		coordinator.AggregationClippedMean: distro.AggregateClippedMean,
	} {
		m := runModel()
		m.Optimizer.Aggregation = from
		if got, err := Distro(&m, 1); err != nil || got.Aggregation != want {
			t.Errorf("%s: Distro = %s, %v; want %s", from, got.Aggregation, err, want)
		}
	}
	if distro.AggregateRobust != 0 || coordinator.AggregationRobust != 0 {
		t.Error("the robust rule must be the zero value: models that name none get it")
	}
	m := runModel()
	m.Optimizer.Aggregation = 3
	if _, err := Distro(&m, 1); !errors.Is(err, ErrOptimizer) {
		t.Errorf("an unknown aggregation: %v, want ErrOptimizer", err)
	}
}

// TestDistroNormalization: the run's normalization reaches the optimizer,
// the zero value (every model written before the field) being rms.
func TestDistroNormalization(t *testing.T) {
	for from, want := range map[coordinator.Normalization]bool{coordinator.NormalizationRMS: true, coordinator.NormalizationNone: false} {
		m := runModel()
		m.Optimizer.Normalization = from
		if got, err := Distro(&m, 1); err != nil || got.NormalizeRMS != want {
			t.Errorf("%s: Distro = %v, %v; want %v", from, got.NormalizeRMS, err, want)
		}
	}
	if coordinator.NormalizationRMS != 0 {
		t.Error("rms must be the zero value: models that name none get it")
	}
	m := runModel()
	m.Optimizer.Normalization = 2
	if _, err := Distro(&m, 1); !errors.Is(err, ErrOptimizer) {
		t.Errorf("an unknown normalization: %v, want ErrOptimizer", err)
	}
}

func TestCheckNamesEveryDifference(t *testing.T) {
	m := runModel()
	other := small
	other.Width, other.Layers = 128, 3
	err := Check(Config{Arch: coordinator.ArchGPT, GPT: other}, &m)
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "d_model is 128 in the model, 64 in the run") ||
		!strings.Contains(err.Error(), "n_layers is 3 in the model, 2 in the run") || strings.Contains(err.Error(), "vocab_size") {
		t.Fatalf("Check = %v", err)
	}
	m.Architecture = 7
	if err := Check(Config{Arch: coordinator.ArchGPT, GPT: small}, &m); !errors.Is(err, ErrMismatch) {
		t.Fatalf("Check against another architecture = %v", err)
	}
	if _, err := ModelConfig(&m); !errors.Is(err, ErrArchitecture) {
		t.Fatalf("ModelConfig of an unknown architecture = %v", err)
	}
}

var smallLlama = LlamaConfig{Vocab: 256, Context: 128, Width: 64, Layers: 2, Heads: 4, KVHeads: 2, Intermediate: 160, RopeTheta: 500000, TiedHead: true}

// TestLlamaRoundTrip: a Llama run model gives back the config it was set
// from, and Check names each Llama field that differs.
func TestLlamaRoundTrip(t *testing.T) {
	var m coordinator.Model
	SetLlama(&m, smallLlama)
	c, err := ModelConfig(&m)
	if err != nil || c != (Config{Arch: coordinator.ArchLlama, Llama: smallLlama}) {
		t.Fatalf("ModelConfig = %+v, %v", c, err)
	}
	if err := Check(c, &m); err != nil {
		t.Fatal(err)
	}
	other := smallLlama
	other.KVHeads, other.Intermediate, other.RopeTheta, other.TiedHead, other.NormEps = 4, 128, 10000, false, 1e-6
	err = Check(Config{Arch: coordinator.ArchLlama, Llama: other}, &m)
	for _, want := range []string{"n_kv_heads is 4 in the model, 2 in the run", "intermediate_size is 128", "rope_theta is 10000", "tied_head is false", "rms_norm_eps"} {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), want) {
			t.Errorf("Check = %v, want %q", err, want)
		}
	}
	if err := Check(Config{Arch: coordinator.ArchGPT, GPT: small}, &m); !errors.Is(err, ErrMismatch) {
		t.Errorf("a GPT against a Llama run: %v", err)
	}
}
