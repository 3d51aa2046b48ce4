package modelspec

import (
	"errors"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
)

var (
	// ErrArchitecture means the run's architecture is not one this trainer
	// builds.
	ErrArchitecture = errors.New("modelspec: unsupported architecture")
	// ErrOptimizer means the run's optimizer cannot train a distributed run.
	ErrOptimizer = errors.New("modelspec: unsupported optimizer")
	// ErrMismatch means a model's config differs from the run's.
	ErrMismatch = errors.New("modelspec: the model differs from the run's")
)

// GPT is the config of the network the run describes. It fails (wrapping
// ErrArchitecture) for an architecture other than GPT, and with gpt's
// validation error for an impossible shape.
func GPT(m *coordinator.Model) (GPTConfig, error) {
	if m.Architecture != coordinator.ArchGPT {
		return GPTConfig{}, fmt.Errorf("%w: %d (this trainer builds %d, GPT)", ErrArchitecture, m.Architecture, coordinator.ArchGPT)
	}
	c := GPTConfig{Vocab: int(m.VocabSize), Context: int(m.MaxSeqLen), Width: int(m.DModel), Layers: int(m.NLayers), Heads: int(m.NHeads)}
	if err := c.Validate(); err != nil {
		return GPTConfig{}, fmt.Errorf("modelspec: the run's model: %w", err)
	}
	return c, nil
}

// SetGPT writes c into the architecture and shape fields of m, leaving the
// rest (data, checkpoint, schedule, optimizer) as it is. GPT(m) then returns c.
func SetGPT(m *coordinator.Model, c GPTConfig) {
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
	if o.Normalization >= 2 {
		return distro.Options{}, fmt.Errorf("%w: normalization %d is unknown to this build", ErrOptimizer, o.Normalization)
	}
	return distro.Options{Chunk: int(o.CompressionChunk), TopK: int(o.CompressionTopK), Quantize1Bit: o.Quantize1Bit,
		RiceIndices: true, Decay: o.CompressionDecay, WeightDecay: o.WeightDecay, ClipGradNorm: o.ClipGradNorm,
		Aggregation: agg, NormalizeRMS: o.Normalization == coordinator.NormalizationRMS, Workers: workers}, nil
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
func Check(c Config, m *coordinator.Model) error {
	if c.Arch != m.Architecture {
		return fmt.Errorf("%w: architecture is %d in the model, %d in the run", ErrMismatch, c.Arch, m.Architecture)
	}
	want, err := ModelConfig(m)
	if err != nil {
		return err
	}
	return Compare(c, want)
}

// Compare reports whether a model's config c is the run's config want,
// wrapping ErrMismatch with every field that differs (named as in run files).
func Compare(c, want Config) error {
	if c.Arch != want.Arch {
		return fmt.Errorf("%w: architecture is %d in the model, %d in the run", ErrMismatch, c.Arch, want.Arch)
	}
	var errs []error
	diff := func(field string, got, want any) {
		if got != want {
			errs = append(errs, fmt.Errorf("%w: %s is %v in the model, %v in the run", ErrMismatch, field, got, want))
		}
	}
	if c.Arch == coordinator.ArchTransformers {
		return compareTransformers(c.Transformers, want.Transformers)
	}
	if c.Arch != coordinator.ArchLlama {
		g, w := c.GPT, want.GPT
		diff("vocab_size", g.Vocab, w.Vocab)
		diff("max_seq_len", g.Context, w.Context)
		diff("d_model", g.Width, w.Width)
		diff("n_layers", g.Layers, w.Layers)
		diff("n_heads", g.Heads, w.Heads)
		return errors.Join(errs...)
	}
	l, w := c.Llama, want.Llama
	diff("vocab_size", l.Vocab, w.Vocab)
	diff("max_seq_len", l.Context, w.Context)
	diff("d_model", l.Width, w.Width)
	diff("n_layers", l.Layers, w.Layers)
	diff("n_heads", l.Heads, w.Heads)
	diff("n_kv_heads", l.KVHeads, w.KVHeads)
	diff("intermediate_size", l.Intermediate, w.Intermediate)
	diff("rope_theta", l.RopeTheta, w.RopeTheta)
	diff("tied_head", l.TiedHead, w.TiedHead)
	// A run has no ε field and trains with the default; a checkpoint made
	// with another would compute something else.
	if l.NormEps != 0 && l.NormEps != DefaultNormEps {
		errs = append(errs, fmt.Errorf("%w: rms_norm_eps is %g in the model; runs train with %g", ErrMismatch, l.NormEps, DefaultNormEps))
	}
	return errors.Join(errs...)
}

// Config is the shape of a model of any architecture: Arch says which of
// GPT, Llama and Transformers applies (the others are zero). It is
// comparable, so a node can tell whether the model it holds is the run's.
type Config struct {
	Arch         coordinator.Architecture
	GPT          GPTConfig
	Llama        LlamaConfig
	Transformers TransformersConfig
}

// NumParams is the number of parameters; 0 for a Transformers model, whose
// count only transformers knows (the engine that builds it reports it).
func (c Config) NumParams() int {
	if c.Arch == coordinator.ArchTransformers {
		return 0
	}
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.NumParams()
	}
	return c.GPT.NumParams()
}

// Layers is the number of transformer blocks.
func (c Config) Layers() int {
	if c.Arch == coordinator.ArchTransformers {
		return c.Transformers.Layers
	}
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.Layers
	}
	return c.GPT.Layers
}

// Context is the longest sequence the model takes.
func (c Config) Context() int {
	if c.Arch == coordinator.ArchTransformers {
		return c.Transformers.Context
	}
	if c.Arch == coordinator.ArchLlama {
		return c.Llama.Context
	}
	return c.GPT.Context
}

// Llama is the Llama config the run describes, failing (wrapping
// ErrArchitecture) for another architecture. A run trains with RMSNorm's
// default ε (DefaultNormEps): the account has no field for it.
func Llama(m *coordinator.Model) (LlamaConfig, error) {
	if m.Architecture != coordinator.ArchLlama {
		return LlamaConfig{}, fmt.Errorf("%w: %d is not %d, Llama", ErrArchitecture, m.Architecture, coordinator.ArchLlama)
	}
	c := LlamaConfig{Vocab: int(m.VocabSize), Context: int(m.MaxSeqLen), Width: int(m.DModel), Layers: int(m.NLayers),
		Heads: int(m.NHeads), KVHeads: int(m.NKVHeads), Intermediate: int(m.IntermediateSize), RopeTheta: m.RopeTheta,
		TiedHead: m.TiedHead}
	if err := c.Validate(); err != nil {
		return LlamaConfig{}, fmt.Errorf("modelspec: the run's model: %w", err)
	}
	return c, nil
}

// SetLlama writes c into the architecture and shape fields of m.
func SetLlama(m *coordinator.Model, c LlamaConfig) {
	m.Architecture = coordinator.ArchLlama
	m.VocabSize, m.MaxSeqLen = uint32(c.Vocab), uint32(c.Context)
	m.DModel, m.NLayers, m.NHeads = uint32(c.Width), uint32(c.Layers), uint32(c.Heads)
	m.NKVHeads, m.IntermediateSize, m.RopeTheta, m.TiedHead = uint32(c.KVHeads), uint32(c.Intermediate), c.RopeTheta, c.TiedHead
}

// ModelConfig is the config of the network the run describes, of whichever
// architecture it names; any other wraps ErrArchitecture.
func ModelConfig(m *coordinator.Model) (Config, error) {
	switch m.Architecture {
	case coordinator.ArchGPT:
		c, err := GPT(m)
		return Config{Arch: coordinator.ArchGPT, GPT: c}, err
	case coordinator.ArchLlama:
		c, err := Llama(m)
		return Config{Arch: coordinator.ArchLlama, Llama: c}, err
	case coordinator.ArchTransformers:
		c, err := Transformers(m)
		return Config{Arch: coordinator.ArchTransformers, Transformers: c}, err
	}
	return Config{}, fmt.Errorf("%w: %d (this trainer builds %d, GPT, and %d, Llama)", ErrArchitecture, m.Architecture, coordinator.ArchGPT, coordinator.ArchLlama)
}
