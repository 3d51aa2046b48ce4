package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// qwen3 is the shape of a Qwen3-family causal LM (transformers' model_type
// qwen3): what the config.json benchengine writes for it says. Nothing is
// fetched: the torch worker and bench_engine_ref.py build the network from
// this text with AutoModelForCausalLM.from_config.
type qwen3 struct {
	vocab, positions, width, layers, heads, kvHeads, headDim, intermediate int
	ropeTheta                                                              float64
	tied                                                                   bool
}

// hfShapes are the transformers models of the benchmark: a tiny one for
// quick and dry runs, one of about 50M parameters at the 50M Llama's
// proportions (vocabulary, width, depth, heads and MLP alike: the rows can
// be read side by side) for this machine's CPU, and the Qwen3-1.7B shape
// (28 blocks of width 2048, 16 query and 8 key/value heads of 128, MLP
// 6144, a tied 151,936-token vocabulary) for scripts/gpu-check.
var hfShapes = map[string]qwen3{
	"qwen3-tiny": {vocab: 256, positions: 128, width: 64, layers: 2, heads: 4, kvHeads: 2, headDim: 16, intermediate: 176,
		ropeTheta: 10000, tied: true},
	"qwen3-50M": {vocab: 256, positions: 128, width: 640, layers: 11, heads: 10, kvHeads: 5, headDim: 64, intermediate: 1728,
		ropeTheta: 10000, tied: true},
	"qwen3-1.7B": {vocab: 151936, positions: 4096, width: 2048, layers: 28, heads: 16, kvHeads: 8, headDim: 128,
		intermediate: 6144, ropeTheta: 1000000, tied: true},
}

// configJSON is q's config.json: the keys transformers' Qwen3 config reads,
// dropout off, no cache.
func (q qwen3) configJSON() []byte {
	c := map[string]any{
		"architectures": []string{"Qwen3ForCausalLM"}, "model_type": "qwen3",
		"vocab_size": q.vocab, "hidden_size": q.width, "intermediate_size": q.intermediate,
		"num_hidden_layers": q.layers, "num_attention_heads": q.heads, "num_key_value_heads": q.kvHeads,
		"head_dim": q.headDim, "max_position_embeddings": q.positions, "rms_norm_eps": 1e-6, "rope_theta": q.ropeTheta,
		"tie_word_embeddings": q.tied, "attention_bias": false, "attention_dropout": 0.0, "hidden_act": "silu",
		"initializer_range": 0.02, "use_cache": false, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
	}
	b, _ := json.MarshalIndent(c, "", "  ") // a map of plain values always marshals
	return b
}

// flopsPerToken is one forward and backward pass per token at sequence t:
// 6 per weight of the matrix products (the head's included, the
// embedding's lookup not) plus attention's q·k and att·v, as the Llama's
// count.
func (q qwen3) flopsPerToken(t int) float64 {
	C, L, I, A := float64(q.width), float64(q.layers), float64(q.intermediate), float64(q.heads*q.headDim)
	kv := float64(2 * q.kvHeads * q.headDim)
	matmul := 6 * (L*(C*(A+kv)+A*C+3*I*C) + float64(q.vocab)*C)
	return matmul + 6*L*float64(t)*A
}

// hfModel is the transformers model of a shape named in hfShapes, for runs
// of seq tokens a sequence (its context), drawn by the engine from seed.
func hfModel(shape string, seq int, seed uint64) (*runmodel.Transformers, modelspec.Config, bool, error) {
	q, ok := hfShapes[shape]
	if !ok {
		return nil, modelspec.Config{}, false, nil
	}
	tf, err := runmodel.NewTransformers(q.configJSON(), seq, seed)
	if err != nil {
		return nil, modelspec.Config{}, true, fmt.Errorf("shape %s: %w", shape, err)
	}
	return tf, modelspec.Config{Arch: coordinator.ArchTransformers, Transformers: tf.Config}, true, nil
}

// describeHF asks a torch worker for the names and shapes of tf's tensors
// (transformers builds the model on the meta device: nothing is drawn).
func describeHF(ctx context.Context, python string, tf *runmodel.Transformers) ([][]int, error) {
	var opts []torch.Option
	if python != "" {
		opts = append(opts, torch.WithPython(python))
	}
	op, err := torch.New(opts...)
	if err != nil {
		return nil, err
	}
	w, err := runmodel.HostWeights(tf)
	if err != nil {
		return nil, err
	}
	if w, err = op.Describe(ctx, w); err != nil {
		return nil, err
	}
	return w.Shapes, nil
}

// notShardedYet says whether err is the torch worker's refusal to shard a
// transformers model. Until that placement exists, the torch-shard row of a
// transformers shape is reported as skipped, not failed; once it exists
// the refusal is gone and the row runs with no change here.
func notShardedYet(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not sharded yet")
}
