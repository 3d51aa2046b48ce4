package node

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/node/machine"
)

// referenceLosses measures the loss of each sequence of ranges on the model
// as it is (machine.TrainWork.Reference).
func (n *Node) referenceLosses(ctx context.Context, ranges []p2p.BatchRange) (map[uint64]float32, error) {
	start := time.Now()
	defer func() {
		n.cfg.metrics.ComputeSeconds.Add(time.Since(start).Seconds())
		n.cfg.metrics.VerifySeconds.Add(time.Since(start).Seconds())
	}()
	e := n.engine()
	b := engine.Batch{SeqLen: e.Config().Context()}
	var idxs []uint64
	for _, r := range ranges {
		rb, err := n.readBatch(ctx, e, r.Start, r.End, 0)
		if err != nil {
			n.logNoData(ctx, err, "the round's loss reports stay unchecked")
			return nil, err
		}
		b.Inputs, b.Targets = append(b.Inputs, rb.Inputs...), append(b.Targets, rb.Targets...)
		for idx := r.Start; idx < r.End; idx++ {
			idxs = append(idxs, idx)
		}
	}
	b.Seqs = len(idxs)
	l, err := e.Losses(computing(ctx), b)
	if err != nil {
		return nil, fmt.Errorf("node: the %s engine: %w", e.Name(), err)
	}
	ref := make(map[uint64]float32, len(idxs))
	for i, v := range l.Seqs {
		ref[idxs[i]] = v
	}
	return ref, nil
}

// verify computes a machine.VerifyWork's score and own-batch loss drop on the model
// as it is, and leaves the model exactly as it found it.
func (n *Node) verify(ctx context.Context, w machine.VerifyWork) (score, drop float32, scored bool, err error) {
	n.finishAhead() // the model is shared with a gradient trained ahead
	start := time.Now()
	defer func() {
		n.cfg.metrics.ComputeSeconds.Add(time.Since(start).Seconds())
		n.cfg.metrics.VerifySeconds.Add(time.Since(start).Seconds())
		n.cfg.metrics.Verifications.Inc()
	}()
	e, plan := n.held()
	trained, err := n.readBatch(ctx, e, w.Batch.Start, w.Batch.End, 0)
	scored = w.Control.End > w.Control.Start
	var control engine.Batch
	if err == nil && scored {
		control, err = n.readBatch(ctx, e, w.Control.Start, w.Control.End, 0)
	}
	if err != nil {
		n.logNoData(ctx, err, "a sampled result stays unscored", "trainer", w.Trainer.Signer.String(), "step", w.Step)
		return 0, 0, false, err
	}
	losses := func() (float64, float64, error) {
		lo, err := e.Losses(computing(ctx), trained)
		if err != nil || !scored {
			return float64(lo.Mean), 0, err
		}
		lc, err := e.Losses(computing(ctx), control)
		return float64(lo.Mean), float64(lc.Mean), err
	}
	before0, beforeC, err := losses()
	if err != nil {
		return 0, 0, false, fmt.Errorf("node: the %s engine: %w", e.Name(), err)
	}
	// w.Frame passed the run's plan's check when it was fetched
	// (judgeFetched), or is this node's own: its aggregate alone is what
	// the result would do to the model.
	c, err := plan.Combine([]*distro.Frame{w.Frame})
	if err != nil {
		return 0, 0, false, fmt.Errorf("node: %w", err)
	}
	if err := e.Try(computing(ctx), c, w.LR); err != nil {
		return 0, 0, false, fmt.Errorf("node: the %s engine: %w", e.Name(), err)
	}
	after0, afterC, err := losses()
	if uerr := e.Undo(computing(ctx)); err == nil && uerr != nil {
		err = uerr
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("node: the %s engine: %w", e.Name(), err)
	}
	own, ctl := before0-after0, beforeC-afterC
	s := (own - ctl) / (math.Abs(own) + math.Abs(ctl) + 1e-12)
	if math.IsNaN(s) || math.IsInf(own+ctl, 0) {
		nan := float32(math.NaN())
		return nan, nan, scored, nil
	}
	n.cfg.log.Debug("verified", "trainer", w.Trainer.Signer.String(), "step", w.Step, "score", s, "own_drop", own, "control_drop", ctl)
	return float32(s), float32(own), scored, nil
}
