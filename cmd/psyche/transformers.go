package main

import (
	"context"
	"fmt"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// openTransformers opens a PyTorch engine (the pinned python, the CPU) on a
// transformers model, for what localnet computes outside its trainers: the
// initial weights (drawn from the model's seed, as every trainer draws
// them) and held-out losses. The optimizer is a placeholder: nothing is
// trained.
func openTransformers(ctx context.Context, m *runmodel.Transformers) (engine.Engine, error) {
	op, err := torch.New()
	if err != nil {
		return nil, err
	}
	w, err := runmodel.HostWeights(m)
	if err != nil {
		return nil, err
	}
	e, err := op.Open(ctx, engine.Spec{Weights: w, Optimizer: distro.Options{Chunk: 64, TopK: 1, Update: distro.UpdateSign}})
	if err != nil {
		return nil, fmt.Errorf("a transformers model needs the torch engine: %w", err)
	}
	return e, nil
}

// drawTransformers is m with the weights its seed draws.
func drawTransformers(ctx context.Context, m *runmodel.Transformers) (runmodel.Model, error) {
	e, err := openTransformers(ctx, m)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	w, err := e.Weights()
	if err != nil {
		return nil, err
	}
	return runmodel.FromWeights(ctx, w, nil)
}
