// Package runmodel owns the one translation between a run's description of
// its model (coordinator.Model: what the coordinator account stores and run
// files set) and what a trainer builds from it: the network's config
// (gpt.Config) and the DisTrO optimizer's options. Every part that needs one
// side from the other (the node loading an epoch's model, localnet and run
// creators describing a model, checks of a checkpoint against a run) goes
// through here, so a new architecture or optimizer field is added in one
// place. The same holds for where the model starts: the checkpoint URL
// (ParseSource: seed:N, file://, http(s)://) and the revision, which is the
// model's hash when it is 32 lowercase hex digits (Revision, CheckRevision).
package runmodel

import (
	"errors"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/gpt"
)

var (
	// ErrArchitecture means the run's architecture is not one this trainer
	// builds.
	ErrArchitecture = errors.New("runmodel: unsupported architecture")
	// ErrOptimizer means the run's optimizer cannot train a distributed run.
	ErrOptimizer = errors.New("runmodel: unsupported optimizer")
	// ErrMismatch means a model's config differs from the run's.
	ErrMismatch = errors.New("runmodel: the model differs from the run's")
)

// GPT is the config of the network the run describes. It fails (wrapping
// ErrArchitecture) for an architecture other than GPT, and with gpt's
// validation error for an impossible shape.
func GPT(m *coordinator.Model) (gpt.Config, error) {
	if m.Architecture != coordinator.ArchGPT {
		return gpt.Config{}, fmt.Errorf("%w: %d (this trainer builds %d, GPT)", ErrArchitecture, m.Architecture, coordinator.ArchGPT)
	}
	c := gpt.Config{Vocab: int(m.VocabSize), Context: int(m.MaxSeqLen), Width: int(m.DModel), Layers: int(m.NLayers), Heads: int(m.NHeads)}
	if err := c.Validate(); err != nil {
		return gpt.Config{}, fmt.Errorf("runmodel: the run's model: %w", err)
	}
	return c, nil
}

// SetGPT writes c into the architecture and shape fields of m, leaving the
// rest (data, checkpoint, schedule, optimizer) as it is. GPT(m) then returns c.
func SetGPT(m *coordinator.Model, c gpt.Config) {
	m.Architecture = coordinator.ArchGPT
	m.VocabSize, m.MaxSeqLen = uint32(c.Vocab), uint32(c.Context)
	m.DModel, m.NLayers, m.NHeads = uint32(c.Width), uint32(c.Layers), uint32(c.Heads)
}

// Distro is the DisTrO optimizer the run describes, computing on workers
// goroutines. A distributed run needs DisTrO (the coordinator also knows
// AdamW, which only the local baseline uses): anything else wraps
// ErrOptimizer. Results use Rice-coded indices: every peer decodes both
// index codings, and these are about a third smaller. The aggregation rule
// comes from the run, never from the trainer: every trainer must combine a
// round's results the same way.
func Distro(m *coordinator.Model, workers int) (distro.Options, error) {
	o := m.Optimizer
	if o.Kind != coordinator.OptimizerDistro {
		return distro.Options{}, fmt.Errorf("%w: %d; a distributed run needs DisTrO (%d)", ErrOptimizer, o.Kind, coordinator.OptimizerDistro)
	}
	agg, ok := aggregations[o.Aggregation]
	if !ok {
		return distro.Options{}, fmt.Errorf("%w: aggregation %d is unknown to this build", ErrOptimizer, o.Aggregation)
	}
	return distro.Options{Chunk: int(o.CompressionChunk), TopK: int(o.CompressionTopK), Quantize1Bit: o.Quantize1Bit,
		RiceIndices: true, Decay: o.CompressionDecay, WeightDecay: o.WeightDecay, ClipGradNorm: o.ClipGradNorm,
		Aggregation: agg, Workers: workers}, nil
}

// aggregations maps the coordinator's aggregation rules to DisTrO's (named
// one by one: the two enums are separate ABIs).
var aggregations = map[coordinator.Aggregation]distro.Aggregation{
	coordinator.AggregationRobust:      distro.AggregateRobust,
	coordinator.AggregationMean:        distro.AggregateMean,
	coordinator.AggregationClippedMean: distro.AggregateClippedMean,
}

// Check reports whether c is the config of the run's model m, wrapping
// ErrMismatch with every field that differs (named as in run files).
func Check(c gpt.Config, m *coordinator.Model) error {
	want, err := GPT(m)
	if err != nil {
		return err
	}
	var errs []error
	diff := func(field string, got, want int) {
		if got != want {
			errs = append(errs, fmt.Errorf("%w: %s is %d in the model, %d in the run", ErrMismatch, field, got, want))
		}
	}
	diff("vocab_size", c.Vocab, want.Vocab)
	diff("max_seq_len", c.Context, want.Context)
	diff("d_model", c.Width, want.Width)
	diff("n_layers", c.Layers, want.Layers)
	diff("n_heads", c.Heads, want.Heads)
	return errors.Join(errs...)
}
