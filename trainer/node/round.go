package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/schedule"
)

// member returns this node's index in the epoch if it is a healthy client.
func (n *Node) member(s *coordinator.Coordinator) (uint16, bool) {
	i, ok := s.ClientIndex(n.id.Signer)
	return i, ok && s.Epoch.Clients[i].State == coordinator.Healthy
}

// onSnapshot reacts to a new coordinator state. It reports whether the node
// is done (the run finished).
func (n *Node) onSnapshot(ctx context.Context, s *coordinator.Coordinator) (bool, error) {
	n.mu.Lock()
	n.snap = s
	n.mu.Unlock()
	n.net.SetStep(s.Progress.Step)
	allowed := make([]coordinator.ClientID, 0, int(s.Epoch.ClientsLen)+int(s.PendingLen))
	for _, c := range s.Epoch.Clients[:s.Epoch.ClientsLen] {
		allowed = append(allowed, c.ID)
	}
	allowed = append(allowed, s.Pending[:s.PendingLen]...)
	n.net.SetClients(allowed)
	n.progress.State, n.progress.Epoch, n.progress.Step = s.RunState, s.Progress.Epoch, s.Progress.Step
	defer n.report()

	epochTag := s.Progress.Epoch + 1
	switch s.RunState {
	case coordinator.Finished:
		n.cfg.log.Info("run finished", "epoch", s.Progress.Epoch, "step", s.Progress.Step)
		return true, nil
	case coordinator.WaitingForMembers:
		if n.cfg.epochs > 0 && n.trained >= n.cfg.epochs {
			n.cfg.log.Info("leaving after the epochs asked for", "epochs", n.trained)
			return true, nil
		}
		if _, pending := s.PendingIndex(n.id.Signer); !pending && n.joined != epochTag {
			n.joined = epochTag
			if _, err := n.backend.Send(ctx, n.runID, n.signer, nil, &coordinator.JoinRun{ID: n.id}); err != nil {
				n.cfg.log.Warn("join refused; will try again next epoch", "err", err)
			} else {
				n.cfg.log.Info("joined; waiting for the epoch to start", "epoch", s.Progress.Epoch)
			}
		}
	case coordinator.Warmup:
		if _, ok := n.member(s); !ok {
			return false, nil
		}
		if err := n.load(ctx, s); err != nil {
			return false, err
		}
		if n.warmedUp != epochTag {
			n.warmedUp = epochTag
			n.sendWitness(ctx, s, true)
		}
	case coordinator.RoundTrain, coordinator.RoundWitness:
		if _, ok := n.member(s); !ok || n.model == nil {
			return false, nil
		}
		if err := n.applyDue(ctx, s); err != nil {
			return false, err
		}
		if s.RunState == coordinator.RoundTrain {
			if err := n.train(ctx, s); err != nil {
				return false, err
			}
			n.healthChecks(ctx, s)
		}
		n.maybeWitness(ctx)
	case coordinator.Cooldown:
		i, ok := n.member(s)
		if ok && n.model != nil && n.held != epochTag {
			n.held = epochTag // this node holds the epoch's final model
			n.trained++
		}
		if ok && n.ckpt != epochTag && n.cfg.checkpoints != "" && n.model != nil && s.IsCheckpointer(i) {
			n.ckpt = epochTag
			n.saveCheckpoint(ctx, s)
		}
	}
	n.forget(s)
	return false, nil
}

// forget drops results and round bookkeeping that can no longer be used.
func (n *Node) forget(s *coordinator.Coordinator) {
	for step := range n.results {
		if step+4 < s.Progress.Step {
			delete(n.results, step)
		}
	}
	if len(n.rejected) > 4096 {
		clear(n.rejected) // commitments are per step; old ones cannot come back
	}
	for step := range n.rounds {
		if step+4 < s.Progress.Step {
			delete(n.rounds, step)
		}
	}
}

func (n *Node) round(step uint32) *roundState {
	r := n.rounds[step]
	if r == nil {
		r = &roundState{}
		n.rounds[step] = r
	}
	return r
}

// load makes sure the model, optimizer and data are ready for the epoch. A
// node that finished the previous epoch keeps its model (it is what P2P
// checkpoints serve); any other loads the checkpoint source.
func (n *Node) load(ctx context.Context, s *coordinator.Coordinator) error {
	if n.ready == s.Progress.Epoch+1 {
		return nil
	}
	m := &s.Model
	cfg := gpt.Config{Vocab: int(m.VocabSize), Context: int(m.MaxSeqLen), Width: int(m.DModel), Layers: int(m.NLayers), Heads: int(m.NHeads)}
	if m.Optimizer.Kind != coordinator.OptimizerDistro {
		return fmt.Errorf("node: the run's optimizer is %d; a distributed run needs DisTrO", m.Optimizer.Kind)
	}
	// n.held == this epoch's number means the node was a client at the end of
	// the previous epoch.
	keep := n.model != nil && n.model.Config == cfg && n.held == s.Progress.Epoch && s.Model.Checkpoint.Kind == coordinator.CheckpointP2P
	if !keep {
		url := coordinator.FixedString(m.Checkpoint.Source.URL[:])
		path, ok := strings.CutPrefix(url, "file://")
		if !ok {
			return fmt.Errorf("node: checkpoint %q: only file:// checkpoints can be loaded so far", url)
		}
		model, err := gpt.Load(path, n.cfg.kernels)
		if err != nil {
			return fmt.Errorf("node: loading the model: %w", err)
		}
		if model.Config != cfg {
			return fmt.Errorf("node: checkpoint holds %+v, the run describes %+v", model.Config, cfg)
		}
		n.model = model
		o := m.Optimizer
		opt, err := distro.NewDeMo(model.Shapes(), distro.Options{Chunk: int(o.CompressionChunk), TopK: int(o.CompressionTopK),
			Quantize1Bit: o.Quantize1Bit, Decay: o.CompressionDecay, WeightDecay: o.WeightDecay, ClipGradNorm: o.ClipGradNorm, Workers: n.cfg.workers})
		if err != nil {
			return err
		}
		n.opt = opt
		n.cfg.log.Info("model loaded", "from", url, "params", cfg.NumParams())
	}
	loc := coordinator.FixedString(m.DataLocation[:])
	if n.data == nil || n.dataLoc != loc {
		p, err := data.Open(ctx, loc, int(m.TokenSize), int(m.MaxSeqLen), n.cfg.dataOpts...)
		if err != nil {
			return fmt.Errorf("node: opening the data: %w", err)
		}
		n.data, n.dataLoc = p, loc
	}
	n.ready = s.Progress.Epoch + 1
	return nil
}

// train runs this node's batch of the current round once, then publishes it.
func (n *Node) train(ctx context.Context, s *coordinator.Coordinator) error {
	step := s.Progress.Step
	rs := n.round(step)
	if rs.trained {
		return nil
	}
	rs.trained = true
	i, _ := n.member(s)
	r := s.CurrentRound()
	assignment := s.RoundAssignment(r)
	if int(i) >= len(assignment) || assignment[i].Count == 0 {
		return nil // more trainers than sequences this round
	}
	d := assignment[i]
	seqLen := int(s.Model.MaxSeqLen)
	in, tg := make([]uint32, 0, int(d.Count)*seqLen), make([]uint32, 0, int(d.Count)*seqLen)
	buf := make([]uint32, seqLen+1)
	for idx := d.Start; idx < d.Start+d.Count; idx++ {
		seq, err := n.data.Sequence(ctx, idx, buf)
		if err != nil {
			return fmt.Errorf("node: data index %d: %w", idx, err)
		}
		in = append(in, seq[:seqLen]...)
		tg = append(tg, seq[1:seqLen+1]...)
	}
	start := time.Now()
	loss, err := n.model.Forward(in, tg, int(d.Count), seqLen)
	if err != nil {
		return err
	}
	n.model.ZeroGrad()
	if err := n.model.Backward(); err != nil {
		return err
	}
	frame, err := n.opt.Step(n.model.GradTensors(), schedule.LR(s.Model.LR, step))
	if err != nil {
		return fmt.Errorf("node: step %d: %w", step, err)
	}
	payload, err := frame.MarshalBinary()
	if err != nil {
		return err
	}
	if n.cfg.corrupt != nil {
		payload = n.cfg.corrupt(payload)
	}
	batch := p2p.BatchRange{Start: d.Start, End: d.Start + d.Count}
	ann, err := n.net.Publish(ctx, step, batch, payload)
	if err != nil {
		return fmt.Errorf("node: publishing step %d: %w", step, err)
	}
	n.store(ann, frame)
	n.progress.Loss = loss
	n.progress.Tokens += d.Count * uint64(seqLen)
	n.progress.Sent += uint64(len(payload))
	n.cfg.log.Info("trained", "step", step, "batch", fmt.Sprintf("[%d,%d)", batch.Start, batch.End), "loss", loss,
		"bytes", len(payload), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// expectedBatches lists the batch starts of a round that have a trainer.
func expectedBatches(s *coordinator.Coordinator, r *coordinator.Round) []uint64 {
	var out []uint64
	for _, d := range s.RoundAssignment(r) {
		if d.Count > 0 {
			out = append(out, d.Start)
		}
	}
	return out
}

// maybeWitness sends this node's witness report for the current round once
// every result is in, or at the latest when the round reaches RoundWitness.
func (n *Node) maybeWitness(ctx context.Context) {
	n.mu.Lock()
	s := n.snap
	n.mu.Unlock()
	if s == nil || (s.RunState != coordinator.RoundTrain && s.RunState != coordinator.RoundWitness) {
		return
	}
	step := s.Progress.Step
	if n.round(step).witnessed {
		return
	}
	if s.RunState == coordinator.RoundTrain {
		for _, b := range expectedBatches(s, s.CurrentRound()) {
			if n.results[step][b] == nil {
				return
			}
		}
	}
	n.sendWitness(ctx, s, false)
}

// sendWitness builds and sends a witness (or warmup witness) report if this
// node is an elected witness of the current round.
func (n *Node) sendWitness(ctx context.Context, s *coordinator.Coordinator, warmup bool) {
	i, ok := n.member(s)
	if !ok {
		return
	}
	r := s.CurrentRound()
	proof := s.Config.WitnessProofFor(r, i)
	if !warmup {
		n.round(s.Progress.Step).witnessed = true
	}
	if !proof.IsWitness {
		return
	}
	w := coordinator.Witness{Proof: proof, Key: randomKey()}
	w.Metadata.Step = s.Progress.Step
	w.Metadata.Loss = n.progress.Loss
	var commitments []coordinator.Hash
	if !warmup {
		// Clients the round gave no data (more trainers than sequences) did
		// all they were asked to.
		for k, d := range s.RoundAssignment(r) {
			if d.Count == 0 && k < int(s.Epoch.ClientsLen) {
				w.Participants.Add(w.Key, coordinator.ParticipantMember(s.Epoch.Clients[k].ID.Signer))
			}
		}
		batches := n.results[s.Progress.Step]
		starts := make([]uint64, 0, len(batches))
		for b := range batches {
			starts = append(starts, b)
		}
		sort.Slice(starts, func(a, b int) bool { return starts[a] < starts[b] })
		for _, b := range starts {
			res := batches[b]
			w.Participants.Add(w.Key, coordinator.ParticipantMember(res.ann.Trainer.Signer))
			w.Broadcasts.Add(w.Key, res.ann.Commitment)
			commitments = append(commitments, res.ann.Commitment)
		}
	}
	h := sha256.New()
	for _, c := range commitments {
		h.Write(c[:])
	}
	copy(w.Merkle[:], h.Sum(nil))
	var ix coordinator.Instruction = &coordinator.WitnessRound{Report: w}
	if warmup {
		ix = &coordinator.WarmupWitness{Report: w}
	}
	if _, err := n.backend.Send(ctx, n.runID, n.signer, nil, ix); err != nil {
		n.cfg.log.Warn("witness refused", "ix", ix.Name(), "step", s.Progress.Step, "err", err)
		return
	}
	n.progress.Witnessed++
	n.cfg.log.Info("witnessed", "ix", ix.Name(), "step", s.Progress.Step, "results", len(commitments), "bits", w.Participants.Count(), "state", s.RunState.String())
}

// applyDue applies the consensus results of the round two rounds back (train
// h, witness h during h+1, apply at the start of h+2), once. Every node
// applies the same results in the same order, so their models stay equal.
func (n *Node) applyDue(ctx context.Context, s *coordinator.Coordinator) error {
	cur := s.CurrentRound()
	if cur.Height < 2 {
		return nil
	}
	step := s.Progress.Step - 2
	rs := n.round(step)
	if rs.applied {
		return nil
	}
	r := s.RoundAtHeight(cur.Height - 2)
	if r == nil {
		return nil
	}
	rs.applied = true
	type batchFrame struct {
		start uint64
		frame *distro.Frame
	}
	var frames []batchFrame
	var missing []uint64
	quorum := coordinator.Quorum(s.Config.WitnessCount(r.ClientsLen))
	assignment := s.RoundAssignment(r)
	for ti, d := range assignment {
		if d.Count == 0 {
			continue
		}
		b := d.Start
		res := n.results[step][b]
		if res == nil {
			// Only a result a quorum of witnesses received can have won;
			// a trainer they did not see produced nothing to apply.
			if ti < int(s.Epoch.ClientsLen) && coordinator.HealthScore(r, s.Epoch.Clients[ti].ID.Signer) >= quorum {
				missing = append(missing, b)
			}
			continue
		}
		if _, ok := s.Config.ConsensusCommitment(r, []coordinator.Hash{res.ann.Commitment}); ok {
			frames = append(frames, batchFrame{b, res.frame})
		}
	}
	if len(missing) > 0 {
		// Results that gossip lost: ask peers directly, then fetch them.
		anns, err := n.net.Pull(ctx, step)
		if err != nil {
			n.cfg.log.Warn("pull failed", "step", step, "err", err)
		}
		for _, a := range anns {
			if !containsStart(missing, a.Batch.Start) {
				continue
			}
			if _, ok := s.Config.ConsensusCommitment(r, []coordinator.Hash{a.Commitment}); !ok {
				continue
			}
			payload, err := n.net.Fetch(ctx, a)
			if err != nil {
				continue
			}
			f, err := distro.DecodeFrame(payload, distro.DefaultLimits)
			if err != nil || n.opt.Check(f) != nil {
				continue
			}
			n.store(a, f)
			frames = append(frames, batchFrame{a.Batch.Start, f})
			missing = removeStart(missing, a.Batch.Start)
		}
		if len(missing) > 0 {
			n.cfg.log.Error("results with witness consensus are missing; this model now differs from the others", "step", step, "batches", missing)
		}
	}
	if len(frames) == 0 {
		return nil
	}
	// The same order on every node, so that the sums round the same way.
	sort.Slice(frames, func(a, b int) bool { return frames[a].start < frames[b].start })
	ordered := make([]*distro.Frame, len(frames))
	for k, f := range frames {
		ordered[k] = f.frame
	}
	if err := n.opt.Apply(n.model.Tensors(), ordered, schedule.LR(s.Model.LR, step)); err != nil {
		return fmt.Errorf("node: applying step %d: %w", step, err)
	}
	n.progress.Applied++
	n.cfg.log.Info("applied", "step", step, "results", len(frames))
	return nil
}

func containsStart(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func removeStart(s []uint64, v uint64) []uint64 {
	out := s[:0]
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// healthChecks reports, once per round, the clients that a quorum of the
// previous round's witnesses did not see. Only that round's witnesses report,
// and the coordinator checks every claim against the blooms itself.
func (n *Node) healthChecks(ctx context.Context, s *coordinator.Coordinator) {
	prev := s.PreviousRound()
	if prev == nil {
		return
	}
	rs := n.round(s.Progress.Step)
	if rs.checked {
		return
	}
	rs.checked = true
	me, ok := n.member(s)
	if !ok {
		return
	}
	wasWitness := false
	for k := 0; k < int(prev.WitnessesLen); k++ {
		wasWitness = wasWitness || prev.Witnesses[k].Proof.Index == me
	}
	if !wasWitness {
		return
	}
	quorum := coordinator.Quorum(s.Config.WitnessCount(prev.ClientsLen))
	cur := s.CurrentRound()
	for i := uint16(0); i < s.Epoch.ClientsLen; i++ {
		c := s.Epoch.Clients[i]
		if c.State != coordinator.Healthy || coordinator.HealthScore(prev, c.ID.Signer) >= quorum {
			continue
		}
		proof := s.Config.HealthCheckProofFor(cur, i)
		if _, err := n.backend.Send(ctx, n.runID, n.signer, nil, &coordinator.HealthCheck{ID: c.ID, Proof: proof}); err != nil {
			n.cfg.log.Warn("health check refused", "client", i, "err", err)
			continue
		}
		n.cfg.log.Info("reported an unhealthy client", "client", i, "step", s.Progress.Step, "score", coordinator.HealthScore(prev, c.ID.Signer), "witnesses", prev.WitnessesLen, "prevheight", prev.Height)
	}
}

// saveCheckpoint writes the model and records it (elected checkpointers).
func (n *Node) saveCheckpoint(ctx context.Context, s *coordinator.Coordinator) {
	path, err := filepath.Abs(filepath.Join(n.cfg.checkpoints, fmt.Sprintf("%s-epoch%d-step%d.safetensors", n.runID, s.Progress.Epoch, s.Progress.Step)))
	if err != nil {
		n.cfg.log.Warn("checkpoint path", "err", err)
		return
	}
	if err := n.model.Save(ctx, path, map[string]string{"run": n.runID, "epoch": fmt.Sprint(s.Progress.Epoch), "step": fmt.Sprint(s.Progress.Step)}); err != nil {
		n.cfg.log.Warn("saving a checkpoint failed", "err", err)
		return
	}
	var src coordinator.CheckpointSource
	if err := coordinator.SetFixedString(src.URL[:], "file://"+path); err != nil {
		n.cfg.log.Warn("checkpoint path too long to record", "path", path)
		return
	}
	if _, err := n.backend.Send(ctx, n.runID, n.signer, nil, &coordinator.RecordCheckpoint{Source: src}); err != nil && !errors.Is(err, coordinator.ErrAlreadyCheckpointed) {
		n.cfg.log.Warn("recording the checkpoint failed", "err", err)
		return
	}
	n.cfg.log.Info("checkpoint recorded", "path", path)
}
