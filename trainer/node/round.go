package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/node/drive"
	"github.com/psyche-go/psyche/trainer/node/machine"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/store"
	"github.com/psyche-go/psyche/trainer/weights"
)

// engineTimeout is how long one computation of a round may take before the
// engine is taken to hang: twice the run's training limit, at least a
// minute (a round's gradient, step and apply fit in the training limit on a
// trainer the run can use at all), and never less than the round's whole
// batch takes at slowestFLOPs: a large model on a CPU is slow, not hung
// (a run on virtual time, whose limits count waiting, not computing, has
// no other bound on a step).
func engineTimeout(s *coordinator.Coordinator) time.Duration {
	d := max(time.Minute, 2*time.Duration(s.Config.MaxRoundTrainTime)*time.Second)
	if cfg, err := modelspec.ModelConfig(&s.Model); err == nil {
		// About 6 FLOPs a parameter a token: the forward pass and the
		// backward pass's two products.
		flops := 6 * float64(cfg.NumParams()) * float64(s.Config.GlobalBatchSizeEnd) * float64(s.Model.MaxSeqLen)
		d = max(d, time.Duration(flops/slowestFLOPs*float64(time.Second)))
	}
	return d
}

// slowestFLOPs is the slowest compute, in FLOPs a second, engineTimeout
// allows for: a tenth of one small CPU core's fp32 rate.
const slowestFLOPs = 1e9

// aheadRun is a gradient trained ahead in the background (machine.TrainWork.Ahead):
// the engine holds it once done is closed.
type aheadRun struct {
	work machine.TrainWork
	done chan struct{}
	loss float32
	// seqLosses are each sequence's loss (the frame's claim)
	seqLosses []float32
	took      time.Duration // computing the gradient (the batch's rates count it)
	err       error
}

// startAhead computes w's gradient in the background. The Run loop goes on
// meanwhile (fetching, witnessing); anything that touches the model waits
// for it first (finishAhead).
func (n *Node) startAhead(ctx context.Context, w machine.TrainWork) {
	a := &aheadRun{work: w, done: make(chan struct{})}
	n.ahead = a
	n.cfg.metrics.AheadTrained.Inc()
	working := n.cfg.clock.Work()
	go func() {
		defer working()
		defer close(a.done)
		a.loss, a.seqLosses, a.took, a.err = n.gradient(ctx, &a.work, nil)
	}()
}

// computing is the context of one computation of the engine: the end of
// Run does not interrupt it (the engine's own timeout bounds it, and Run
// waits for it). Interrupted, a PyTorch worker is killed (its state in the
// middle of a request is unknown) and with it the model the node keeps
// after Run: a trainer stopped while it trained ahead lost its weights, and
// a localnet that compares its trainers' weights at the end found one
// without any.
func computing(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// weights are the engine's weights, each read of which is a computation
// (computing): a save or a hash that Run's end interrupts stops between two
// reads, never in one.
func (n *Node) weights(e engine.Engine) (weights.Weights, error) {
	w, err := e.Weights()
	if err != nil {
		return w, err
	}
	read := w.Read
	w.Read = func(ctx context.Context, i, off int, dst []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return read(computing(ctx), i, off, dst)
	}
	return w, nil
}

// failed reports whether the gradient trained ahead is done and failed
// (its data did not come): the batch is read again, or sat out.
func (a *aheadRun) failed() bool {
	select {
	case <-a.done:
		return a.err != nil
	default:
		return false
	}
}

// notify gossips the training notice of w's batch (p2p.Notice): this node
// has its data and computes it. The round's witnesses then wait for its
// result up to the round's training limit, instead of giving it up after
// their patience for a trainer that said nothing (patience.go): on a busy
// machine an honest trainer's result can come seconds after the others'.
// It is sent once the data is in (or, for a gradient trained ahead, as
// the round begins), so a node that sits the round out for want of data
// sends none and is not waited for.
func (n *Node) notify(ctx context.Context, w *machine.TrainWork) {
	if n.cfg.silent {
		return
	}
	if err := n.net.Notify(ctx, w.Step, w.Batch); err != nil {
		n.cfg.log.Debug("training notice not sent", "step", w.Step, "err", err)
	}
}

// reusable is the gradient trained ahead that w may use instead of computing
// its own (done or still computing), or nil: the machine decides whether a
// gradient trained ahead is still valid (w.Reuse: the parameters it was
// taken at are those of w's round); this node holds it only if it trained
// w's own step and batch.
func (n *Node) reusable(w *machine.TrainWork) *aheadRun {
	if a := n.ahead; w.Reuse && a != nil && a.work.Step == w.Step && a.work.Batch == w.Batch {
		return a
	}
	return nil
}

// finishAhead waits for the gradient trained ahead, if one is running.
func (n *Node) finishAhead() {
	if n.ahead != nil {
		<-n.ahead.done
	}
}

// dropAhead forgets the gradient trained ahead: the model is about to
// change, so it no longer belongs to it.
func (n *Node) dropAhead() {
	n.finishAhead()
	n.ahead = nil
}

// readBatch reads the sequences [start, end) of the run's data (each index
// shifted by shift) as an engine batch.
func (n *Node) readBatch(ctx context.Context, e engine.Engine, start, end, shift uint64) (engine.Batch, error) {
	seqLen := e.Config().Context()
	count := int(end - start)
	b := engine.Batch{Seqs: count, SeqLen: seqLen,
		Inputs: make([]uint32, 0, count*seqLen), Targets: make([]uint32, 0, count*seqLen)}
	buf := make([]uint32, seqLen+1)
	for idx := start; idx < end; idx++ {
		seq, err := n.data.Sequence(ctx, idx+shift, buf)
		if err != nil {
			return engine.Batch{}, &dataError{fmt.Errorf("node: data index %d: %w", idx, err)}
		}
		b.Inputs = append(b.Inputs, seq[:seqLen]...)
		b.Targets = append(b.Targets, seq[1:seqLen+1]...)
	}
	return b, nil
}

// dataError is a failure to read the run's data: it costs the node a
// round (drive.ErrNoData), never its run. It reads as its cause.
type dataError struct{ err error }

func (e *dataError) Error() string   { return e.err.Error() }
func (e *dataError) Unwrap() []error { return []error{e.err, drive.ErrNoData} }

// logNoData says why the node does without its data for what, unless the
// node is stopping: a failure that trying again may mend (a busy server)
// as a warning, one that it cannot (no such file, a file of another
// format) as an error.
func (n *Node) logNoData(ctx context.Context, err error, what string, attrs ...any) {
	if ctx.Err() != nil {
		return
	}
	level := slog.LevelError
	if data.Transient(err) {
		level = slog.LevelWarn
	}
	n.cfg.log.Log(ctx, level, "the run's data could not be read; "+what, append(attrs, "err", err)...)
}

// gradient reads w's batch and leaves the gradient on it in the engine; it
// returns the loss, each sequence's loss and how long computing it took
// (reading the data not included).
// began, if set, is called once the data is in, as the computing begins.
func (n *Node) gradient(ctx context.Context, w *machine.TrainWork, began func()) (float32, []float32, time.Duration, error) {
	e := n.engine()
	b, err := n.readBatch(ctx, e, w.Batch.Start, w.Batch.End, n.cfg.dataShift)
	if err != nil {
		return 0, nil, 0, err
	}
	if began != nil {
		began()
	}
	start := time.Now()
	defer func() { n.cfg.metrics.ComputeSeconds.Add(time.Since(start).Seconds()) }()
	l, err := e.Gradient(computing(ctx), b)
	if err != nil {
		return 0, nil, 0, fmt.Errorf("node: the %s engine: %w", e.Name(), err)
	}
	return l.Mean, l.Seqs, time.Since(start), nil
}

// train runs this node's batch, steps the optimizer and publishes the
// result. The gradient is the one trained ahead when the machine says it is
// still valid and this node holds it; otherwise it is computed now.
func (n *Node) train(ctx context.Context, w *machine.TrainWork) (p2p.Announcement, *distro.Frame, machine.TrainStats, error) {
	notified := false
	notify := func() {
		if !notified {
			notified = true
			n.notify(ctx, w)
		}
	}
	a := n.reusable(w)
	if a != nil && !a.failed() {
		notify() // begun before the round: say so as it begins, not once the gradient is done
	}
	n.dropAhead()
	var (
		loss      float32
		seqLosses []float32
		computed  time.Duration // the gradient's compute, ahead or now
		reused    bool
	)
	if a != nil && a.err == nil {
		loss, seqLosses, computed, reused = a.loss, a.seqLosses, a.took, true
		n.cfg.metrics.AheadReused.Inc()
	} else {
		// The data may take until the round's training time ends (a data
		// server that answers 429 under load): the reads retry until then.
		until := time.Now().Add(time.Unix(int64(w.Deadline), 0).Sub(n.cfg.clock.Now()))
		var err error
		if loss, seqLosses, computed, err = n.gradient(data.RetryUntil(ctx, until), w, notify); err != nil {
			if errors.Is(err, drive.ErrNoData) {
				n.logNoData(ctx, err, "sitting this round out", "step", w.Step)
			}
			return p2p.Announcement{}, nil, machine.TrainStats{}, err
		}
	}
	e := n.engine()
	count := int(w.Batch.End - w.Batch.Start)
	seqLen := e.Config().Context()
	start := time.Now()
	frame, err := e.Step(computing(ctx), w.LR)
	if err != nil {
		return p2p.Announcement{}, nil, machine.TrainStats{}, fmt.Errorf("node: step %d: %w", w.Step, err)
	}
	stepped := time.Since(start) // DisTrO's compression of the gradient
	frame.Losses = seqLosses     // what this trainer saw of its batch, for the witnesses' claim checks
	payload, err := frame.MarshalBinary()
	if err != nil {
		return p2p.Announcement{}, nil, machine.TrainStats{}, err
	}
	n.cfg.metrics.ComputeSeconds.Add(time.Since(start).Seconds()) // publishing is networking
	if n.cfg.freeRide != nil {
		payload = n.cfg.freeRide(payload, n.m.OthersResults(w.Step))
	}
	if n.cfg.corrupt != nil {
		payload = n.cfg.corrupt(payload)
	}
	var ann p2p.Announcement
	if n.cfg.publish != nil {
		ann, err = n.cfg.publish(ctx, n.net, w.Step, w.Batch, payload)
	} else {
		ann, err = n.net.Publish(ctx, w.Step, w.Batch, payload)
	}
	if err != nil {
		return p2p.Announcement{}, nil, machine.TrainStats{}, fmt.Errorf("node: publishing step %d: %w", w.Step, err)
	}
	if ann.Trainer == (coordinator.ClientID{}) {
		ann.Trainer = n.id // a publish hook that announced nothing yet (adversary.go)
	}
	n.cfg.metrics.Loss.Set(float64(loss))
	n.cfg.metrics.Steps.Inc()
	n.cfg.metrics.Tokens.Add(float64(count * seqLen))
	n.cfg.metrics.SentBytes.Add(float64(len(payload)))
	// Per step: DEBUG (the progress line, the explorer and the epoch's
	// INFO line say it).
	n.cfg.log.Debug("trained", "step", w.Step, "batch", fmt.Sprintf("[%d,%d)", w.Batch.Start, w.Batch.End), "loss", loss,
		"bytes", len(payload), "took", (computed + time.Since(start)).Round(time.Millisecond), "distro", stepped.Round(time.Millisecond),
		"ahead", reused)
	// The rates cover training and publishing: what the batch cost this
	// trainer (its gradient's compute too when trained ahead), reported in
	// its witness metadata.
	secs := float32(max((computed + time.Since(start)).Seconds(), 1e-3))
	return ann, frame, machine.TrainStats{Loss: loss, TokensPerSec: float32(count*seqLen) / secs, BytesPerSec: float32(len(payload)) / secs}, nil
}

// apply applies a round's consensus results.
func (n *Node) apply(ctx context.Context, w *machine.ApplyWork) error {
	n.dropAhead() // trained on the model before this apply
	n.cfg.metrics.ResultsMissing.Add(float64(len(w.Missing)))
	if len(w.Missing) > 0 {
		n.cfg.log.Error("results with witness consensus are missing; this model now differs from the others", "step", w.Step, "batches", w.Missing)
	}
	if len(w.Frames) == 0 {
		return nil
	}
	start := time.Now()
	defer func() { n.cfg.metrics.ComputeSeconds.Add(time.Since(start).Seconds()) }()
	// The run's rule combines the round once, here; the engine applies the
	// aggregate wherever the parameters are.
	e, plan := n.held()
	c, err := plan.Combine(w.Frames)
	if err != nil {
		return fmt.Errorf("node: combining step %d: %w", w.Step, err)
	}
	if err := e.Apply(computing(ctx), c, w.LR); err != nil {
		return fmt.Errorf("node: applying step %d: %w", w.Step, err)
	}
	n.cfg.metrics.RoundsApplied.Inc()
	n.cfg.metrics.ResultsApplied.Add(float64(len(w.Frames)))
	n.cfg.log.Debug("applied", "step", w.Step, "results", len(w.Frames), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// saveCheckpoint writes the model and records it (elected checkpointers).
// With a store, the saved directory is uploaded and read back in the
// background (the loop goes on; Run waits for it before returning) and the
// object URL is recorded; if that fails, the file on this disk is recorded
// instead, which this trainer offers to the others after a restart.
func (n *Node) saveCheckpoint(ctx context.Context, w machine.SaveWork) {
	st := store.FromRun(w.Store)
	name := fmt.Sprintf("%s-epoch%d-step%d", n.runID, w.Epoch, w.Step)
	e := n.engine()
	saved, err := n.weights(e)
	if err != nil {
		n.cfg.log.Warn("saving a checkpoint failed: the engine cannot give its weights", "engine", e.Name(), "err", err)
		return
	}
	// What goes to a store is a Hugging Face directory for every model, so
	// the bucket holds what transformers loads.
	hf := !st.IsZero()
	if !runmodel.SavesHF(e.Config(), hf) {
		name += ".safetensors"
	}
	path, err := filepath.Abs(filepath.Join(n.cfg.checkpoints, name))
	if err != nil {
		n.cfg.log.Warn("checkpoint path", "err", err)
		return
	}
	meta := map[string]string{"run": n.runID, "epoch": fmt.Sprint(w.Epoch), "step": fmt.Sprint(w.Step)}
	// Written as it is read from the engine, a chunk at a time: a model on
	// a worker's device is never copied whole into this process.
	if err := runmodel.SaveWeights(ctx, saved, path, hf, meta); err != nil {
		n.cfg.log.Warn("saving a checkpoint failed", "err", err)
		return
	}
	// The saved model's hash as the revision: whoever loads the run from
	// this URL later checks that the checkpoint is still this model.
	rev, err := saved.Revision(ctx)
	if err != nil {
		n.cfg.log.Warn("saving a checkpoint failed: hashing the model", "err", err)
		return
	}
	if st.IsZero() {
		n.recordCheckpoint(ctx, "file://"+path, rev)
		return
	}
	n.uploads.Add(1)
	go func() {
		defer n.uploads.Done()
		url, err := n.uploadCheckpoint(ctx, st, path, w.Step)
		if err != nil {
			n.cfg.log.Warn("uploading the checkpoint to the run's store failed; recording the file on this disk instead (this trainer offers it to the others)",
				"store", st.URL, "err", err)
			url = "file://" + path
		}
		n.recordCheckpoint(ctx, url, rev)
	}()
}

// checkStore checks, in the background, that this trainer can reach the
// run's checkpoint store, once per store setting: a trainer says at start
// what is wrong with the run's store (no such bucket, refused keys, a bad or
// refused endpoint), not at its first upload an epoch later. Its keys go
// only to the endpoint it names itself (WithStoreAccess; store.Access).
func (n *Node) checkStore(ctx context.Context, st coordinator.CheckpointStore) {
	if st == n.storeChecked {
		return
	}
	n.storeChecked = st
	cfg := store.FromRun(st)
	if cfg.IsZero() {
		return
	}
	n.uploads.Add(1)
	go func() {
		defer n.uploads.Done()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s, err := store.Open(cfg, n.storeOptions()...)
		if err == nil {
			err = s.BucketExists(ctx)
		}
		if err != nil {
			n.cfg.log.Warn("the run's checkpoint store cannot be used by this trainer: if elected it records the checkpoint on its own disk instead",
				"store", cfg.URL, "endpoint", cfg.Endpoint, "err", err)
			return
		}
		// Credentials go only to the endpoint the trainer named; to another
		// one it is anonymous, which reads a public bucket but cannot upload.
		n.cfg.log.Info("checkpoint store reachable", "store", cfg.URL, "endpoint", cfg.Endpoint, "own_endpoint", s.Named())
	}()
}

// uploadCheckpoint puts a saved checkpoint in the run's store and returns
// its URL once read back whole.
func (n *Node) uploadCheckpoint(ctx context.Context, st store.Config, path string, step uint32) (string, error) {
	s, err := store.Open(st, n.storeOptions()...)
	if err != nil {
		return "", err
	}
	url := s.CheckpointURL(n.runID, step)
	if err := s.Upload(ctx, path, url); err != nil {
		return "", err
	}
	return url, nil
}

// recordCheckpoint tells the coordinator where this epoch's model is.
func (n *Node) recordCheckpoint(ctx context.Context, url, rev string) {
	var src coordinator.CheckpointSource
	if err := coordinator.SetFixedString(src.URL[:], url); err != nil {
		n.cfg.log.Warn("checkpoint URL too long to record (a checkpoint URL has at most 128 bytes): use a shorter checkpoint directory", "url", url)
		return
	}
	_ = coordinator.SetFixedString(src.Revision[:], rev) // always RevisionLen bytes: fits
	if _, err := n.backend.Send(ctx, n.runID, n.signer, nil, &coordinator.RecordCheckpoint{Source: src}); err != nil && !errors.Is(err, coordinator.ErrAlreadyCheckpointed) {
		n.cfg.log.Warn("recording the checkpoint failed", "err", err)
		return
	}
	n.cfg.log.Info("checkpoint recorded", "url", url, "revision", rev)
}
