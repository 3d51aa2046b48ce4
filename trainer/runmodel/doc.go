// Package runmodel builds the model a run describes: the network of the
// config trainer/modelspec reads from the run's coordinator.Model (New,
// Init), loaded from a checkpoint (Load, FromCheckpoint, each vetting the
// checkpoint's config before allocating) or saved as one (Save; a model held
// elsewhere, an engine's, as trainer/weights' Weights, read a piece at a
// time: SaveWeights), and checked against the run's revision, which is the
// model's hash when it is 32 lowercase hex digits (Revision, CheckRevision;
// the rule is trainer/weights'). It makes Weights of a model, a seed or a
// checkpoint on disk (HostWeights, Seeded, OpenChecked) and a model of
// Weights (FromWeights), so the engine seam, which hands models across as
// Weights, compiles no model. What a run says about
// its model without building one (shapes, parameter counts, optimizer
// options, the checkpoint URL's kinds) is modelspec's, so a part that only
// reads a run need not compile the models and their kernels.
package runmodel
