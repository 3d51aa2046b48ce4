package machine

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
)

// Ready is what the driver does next, in field order. Work that answers
// with an event (a load, a training) is followed, after the rest of this
// Ready, by the Ready that event returns; Fetch, Pull and Tick answer later,
// as events of their own.
type Ready struct {
	// Apply asks to apply a round's consensus results, in this order.
	Apply *ApplyWork
	// Load asks for the model, optimizer and data of an epoch, from the
	// source it names (load.go). Answer with Loaded, or LoadFailed.
	Load *LoadWork
	// Train asks to train this node's batch and publish it. Answer with
	// trainedResult, or SatOut when its data did not come.
	Train *TrainWork
	// Send lists instructions for the coordinator.
	Send []coordinator.Instruction
	// Fetch lists announced results to fetch and check. Answer each with
	// fetched.
	Fetch []p2p.Announcement
	// Pull asks peers directly for a step's announcements. Answer with pulled.
	Pull *uint32
	// Share asks to serve the model to the joiners of epoch Share (a P2P
	// checkpoint): this node ended the epoch before with every result
	// applied.
	Share *uint32
	// Save asks to save the model and record it as the epoch's checkpoint.
	Save *SaveWork
	// Tick asks to send a tick instruction (WithTicking). Answer with
	// tickSent once it has landed or failed.
	Tick bool
	// Done says the node should stop, and why: the run is finished, or the
	// node has trained the epochs it was asked to.
	Done string
	// Report lists peers (p2p keys) caught equivocating: the driver tells
	// the network, which then trusts them less (gossip scoring).
	Report []coordinator.Pubkey
	// Refused lists results refused for what they say rather than for how
	// they were sent (a copy of another trainer's, a replay): the driver
	// logs and counts them.
	Refused []RefusedResult
	// Verify lists sampled results to score (verified work, verify.go).
	// Answer each with verified.
	Verify []VerifyWork
	// Reports lists the loss reports checked (verify.go): the driver logs
	// them, so that a refusal can be traced to the reports behind it.
	Reports []ReportChecked
	// DropFetches says the fetches in flight and waiting serve nothing
	// now: this node is no longer a client of the epoch (a health check
	// dropped it). Its peers may never answer it (they ignore a peer whose
	// result they refused), and a fetch left to its timeouts would hold
	// the driver's work for minutes.
	DropFetches bool
}

// ReportChecked is the verdict on one sampled result's loss report: Why
// is empty when its losses are this node's.
type ReportChecked struct {
	Trainer coordinator.ClientID
	Step    uint32
	Why     string
}

// RefusedResult is one result refused by the witness rules.
type RefusedResult struct {
	Trainer coordinator.ClientID
	Step    uint32
	Why     string
}

// SaveWork names the checkpoint to save.
type SaveWork struct {
	Epoch, Step uint32
	// Store is the run's checkpoint store (zero: the file stays here).
	Store coordinator.CheckpointStore
}

// LoadWork describes a model load: where the model comes from, and the
// coordinator state of the epoch to load for (its model, checkpoint source
// and holders).
type LoadWork struct {
	Epoch  uint32
	Source LoadSource
	State  *coordinator.Coordinator
}

// TrainWork describes this node's batch of a round.
//
// Ahead: the round has not started; its assignment is the coordinator's
// NextRound. Compute the batch's gradient on the model as it is now, in the
// background, and keep it; nothing is published and nothing answers. The
// driver must finish it before it changes the model (an apply, a load) or
// trains again.
//
// Reuse: the gradient trained ahead for this step and batch is still valid
// (the model has not changed since): step the optimizer with it and publish
// instead of computing it again. A driver that holds no such gradient
// computes it.
type TrainWork struct {
	Step  uint32
	Batch p2p.BatchRange
	LR    float32
	Ahead bool
	Reuse bool
	// Deadline is when the round's training time ends (unix seconds, the
	// run's clock; 0 for a batch trained ahead): the driver may read the
	// batch's data until then, and if it has not come, answer SatOut
	// instead of Trained.
	Deadline uint64
	// Reference lists sequences whose losses this node measures once the
	// result is published, on the model it was trained on (the round's
	// sampled batches' scored sequences, verification_percent): what the
	// sampled trainers' reported losses must match. Answer with
	// referenceLosses, before anything changes the model.
	Reference []p2p.BatchRange
}

// ApplyWork is a round's consensus results. Missing lists batches that a
// quorum of the round's witnesses counted but whose result this node does
// not apply: it never arrived, or this node holds another version than the
// others may apply (its trainer equivocated). The model then differs from
// the others'.
type ApplyWork struct {
	Step    uint32
	Frames  []*distro.Frame
	LR      float32
	Missing []uint64
}
