package main

import (
	"testing"

	"github.com/psyche-go/psyche/trainer/modelspec"
)

// Every transformers shape's config.json is one psyche reads as the shape
// it was written from.
func TestHFShapesConfigJSON(t *testing.T) {
	for name, q := range hfShapes {
		tf, cfg, ok, err := hfModel(name, 32, 1)
		if !ok || err != nil {
			t.Fatalf("%s: hfModel: ok %v, err %v", name, ok, err)
		}
		want := modelspec.TransformersConfig{Vocab: q.vocab, Context: 32, Width: q.width, Layers: q.layers, Heads: q.heads}
		if tf.Config != want || cfg.Transformers != want {
			t.Errorf("%s: read back as %+v (config %+v), want %+v", name, tf.Config, cfg.Transformers, want)
		}
		if tf.File.ModelType != "qwen3" || tf.File.MaxPositions != q.positions {
			t.Errorf("%s: model_type %q, positions %d; want qwen3, %d", name, tf.File.ModelType, tf.File.MaxPositions, q.positions)
		}
	}
	if _, _, ok, _ := hfModel("50M", 32, 1); ok {
		t.Error("the Llama shape 50M was taken for a transformers one")
	}
}

// qwen3-50M has the 50M Llama's proportions, so the rows compare: the same
// count of matrix-product and attention FLOPs a token.
func TestQwen3At50MLlamaProportions(t *testing.T) {
	q, l := hfShapes["qwen3-50M"], shapes["50M"].Llama
	if q.width != l.Width || q.layers != l.Layers || q.heads != l.Heads || q.kvHeads != l.KVHeads ||
		q.intermediate != l.Intermediate || q.vocab != l.Vocab || q.heads*q.headDim != l.Width {
		t.Fatalf("qwen3-50M %+v is not the 50M Llama's shape %+v", q, l)
	}
	if got, want := q.flopsPerToken(128), l.FLOPsPerToken(128); got != want {
		t.Errorf("FLOPs a token at 128: qwen3-50M %g, the 50M Llama %g", got, want)
	}
}
