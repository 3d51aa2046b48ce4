// Package engine owns the seam between a trainer's node and whatever
// computes for it. The node decides what to compute (which batch, at which
// learning rate, which frames to apply, which sequences to score) and hands
// it to an Engine; the engine owns the model's parameters, its gradients,
// the DisTrO optimizer's state and all the arithmetic, wherever they live
// (host memory for the Go engine, a device behind a worker process for the
// PyTorch engine). What crosses the seam each round is batches, frame
// entries and losses: never the parameters. Models cross it once per epoch:
// in when an engine is opened on a loaded model, out when a checkpoint is
// hashed, saved or offered to peers, a range at a time (Engine.Weights).
//
// The run's distro.Plan is the node's: it checks and sizes peers' frames
// and combines a round's frames once (distro.Plan.Combine), so every
// engine applies a distro.Combined aggregate whose every decision the
// run's rule made on the node's side of the seam. An engine compresses
// its own step under the run's options (Spec.Optimizer) and knows nothing
// of the aggregation rule.
package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/weights"
)

// Batch is b sequences of t tokens: the inputs and, shifted by one, the
// tokens each position must predict, row-major.
type Batch struct {
	Inputs, Targets []uint32
	Seqs, SeqLen    int
}

// Check refuses a batch whose token counts disagree with its shape or whose
// sequences are longer than the model's context: every engine checks what it
// is handed with it before computing.
func (b Batch) Check(context int) error {
	n := b.Seqs * b.SeqLen
	switch {
	case b.Seqs <= 0 || b.SeqLen <= 0:
		return fmt.Errorf("engine: empty batch (%d×%d)", b.Seqs, b.SeqLen)
	case b.SeqLen > context:
		return fmt.Errorf("engine: sequences of %d tokens, the model's context is %d", b.SeqLen, context)
	case len(b.Inputs) != n || len(b.Targets) != n:
		return fmt.Errorf("engine: a %d×%d batch with %d inputs and %d targets", b.Seqs, b.SeqLen, len(b.Inputs), len(b.Targets))
	}
	return nil
}

// Losses are a batch's mean loss (what the model's training minimises) and
// each sequence's own mean loss (what a frame claims, and witnesses check).
type Losses struct {
	Mean float32
	Seqs []float32
}

// Engine computes for one trainer. Its methods are called from one
// goroutine at a time, except the reads of its Weights, which may come at
// any time (each waits for the computation in progress).
type Engine interface {
	// Name says what computes, for logs ("go: openblas fp32", "torch
	// 2.11 on cuda:0, bf16").
	Name() string
	// Config is the shape of the model the engine holds.
	Config() modelspec.Config
	// Shapes are the shapes of the model's tensors in the order its
	// frames, aggregates and models list them: what the run's plan for
	// this engine is cut from (a transformers model's are known only once
	// an engine has built it).
	Shapes() [][]int
	// Gradient computes the gradient of the batch at the current
	// parameters and keeps it for Step (replacing any kept one).
	Gradient(ctx context.Context, b Batch) (Losses, error)
	// Step folds the kept gradient into the DisTrO momentum and returns
	// the compressed result to publish (its Losses left to the caller).
	Step(ctx context.Context, lr float32) (*distro.Frame, error)
	// Apply applies a round's aggregate (what distro.Plan.Combine made
	// of its consensus frames): distro.Plan.ApplyCombined's arithmetic,
	// wherever the parameters are.
	Apply(ctx context.Context, c *distro.Combined, lr float32) error
	// Losses is the batch's loss at the current parameters; no gradient is
	// computed and the kept one stays.
	Losses(ctx context.Context, b Batch) (Losses, error)
	// Try applies an aggregate after saving the parameters; Undo restores
	// the saved parameters exactly. A trainer's result is scored this way
	// (the aggregate of its frame alone).
	Try(ctx context.Context, c *distro.Combined, lr float32) error
	Undo(ctx context.Context) error
	// Weights are the engine's parameters, read a range at a time wherever
	// they are held: what the node hashes, saves and offers the model
	// from, never copying it whole. A read is a call like the others (one
	// goroutine at a time, between rounds) and sees the parameters as
	// they are when it runs.
	Weights() (weights.Weights, error)
	// Close releases what the engine holds (a worker process, device
	// memory). The engine is unusable afterwards.
	Close() error
}

// Spec is what an engine is opened on: the model it starts from, as named
// tensors (weights.Weights: the config, the tensors' shapes and names, a
// read of their values, or the seed a transformers model is drawn from),
// and the run's optimizer options, under which the engine compresses its
// steps. The weights are read while Open runs; an engine keeps nothing of
// them but what it copies.
type Spec struct {
	Weights   weights.Weights
	Optimizer distro.Options
	// Timeout bounds one round's computation (a gradient, a step, an
	// apply): an engine whose computation takes longer is taken to hang.
	// Zero means the engine's default.
	Timeout time.Duration
}

// Opener opens engines of one kind; a node opens one per model it loads
// and closes the previous.
type Opener interface {
	Open(ctx context.Context, s Spec) (Engine, error)
	// Name is the kind, for logs and errors ("go", "torch").
	Name() string
}

// Preparer is an Opener that can get ready before there is a model to
// open: a PyTorch engine starts its worker processes (seconds: Python,
// torch's import, a rank per device), so that the load in a run's warmup
// only moves the weights and a trainer does not spend the warmup starting
// processes while the others begin the first round. A node prepares once,
// before it first joins, and releases the preparation when its run ends.
type Preparer interface {
	// Prepare readies an Open with this timeout (Spec.Timeout); release
	// undoes it if no Open has used it.
	Prepare(ctx context.Context, timeout time.Duration) (release func(), err error)
}

// ModelChecker is an Opener that can say, before a trainer joins a run,
// whether it can train the run's model at all (an architecture it does not
// build, a library missing, a model too large for the device): one line
// then, rather than a failed load in the warmup after joining.
type ModelChecker interface {
	CheckModel(ctx context.Context, m *coordinator.Model) error
}

// Describer is an Opener that builds a model psyche cannot shape itself (a
// transformers model) and can name its tensors and their shapes without
// drawing it, so that a node fetching it from peers knows what a P2P
// checkpoint of it must hold: Describe answers w (the weights of such a
// model not drawn yet: its config and config.json) with its Names and
// Shapes set.
type Describer interface {
	Describe(ctx context.Context, w weights.Weights) (weights.Weights, error)
}

// ErrClosed is returned by an engine used after Close.
var ErrClosed = errors.New("engine: closed")

// ErrNoUndo is returned by Undo without a Try before it.
var ErrNoUndo = errors.New("engine: nothing to undo")
