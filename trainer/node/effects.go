package node

import (
	"context"
	"errors"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/node/drive"
	"github.com/psyche-go/psyche/trainer/node/machine"
)

// effects is how a Node does what its machine decides (drive.Effects),
// within one Run: each effect is finished before it returns, so the
// driver never pauses; what runs in the background (fetches, pulls, ticks,
// the sender, a gradient trained ahead) answers Run's loop through ev.
type effects struct {
	n   *Node
	ctx context.Context
	ev  events
}

var _ drive.Effects = effects{}

func (e effects) Apply(w *machine.ApplyWork) (drive.Step, error) {
	return drive.Done, e.n.apply(e.ctx, w)
}

func (e effects) Load(w *machine.LoadWork) (drive.Step, error) {
	err := e.n.load(e.ctx, w)
	if nl := (*drive.NotLoaded)(nil); errors.As(err, &nl) {
		// The machine chooses the next try (machine/load.go).
		e.n.cfg.log.Warn("model not loaded yet", "from", w.Source.String(), "why", nl.Why.String(), "err", nl.Err)
	}
	return drive.Done, err
}

func (e effects) TrainAhead(w machine.TrainWork) (drive.Step, error) {
	e.n.dropAhead()
	e.n.startAhead(e.ctx, w)
	return drive.Done, nil
}

// Train says Done at once: Trained computes (or takes the gradient trained
// ahead) and publishes in one go.
func (e effects) Train(*machine.TrainWork) (drive.Step, error) { return drive.Done, nil }

func (e effects) Trained(w *machine.TrainWork) (p2p.Announcement, *distro.Frame, machine.TrainStats, error) {
	return e.n.train(e.ctx, w)
}

func (e effects) ReferenceLosses(w *machine.TrainWork) (map[uint64]float32, error) {
	return e.n.referenceLosses(e.ctx, w.Reference)
}

func (e effects) Verify(w machine.VerifyWork) (float32, float32, bool, error) {
	return e.n.verify(e.ctx, w)
}

func (e effects) Send(ixs []coordinator.Instruction) {
	for _, ix := range ixs {
		if _, join := ix.(*coordinator.JoinRun); join {
			e.n.awaitEngine(e.ctx)
		}
		o := outgoing{ix: ix, done: e.n.cfg.clock.Work()} // until it is sent
		select {
		case e.n.sends <- o:
		case <-e.ctx.Done():
			o.done()
		}
	}
}

func (e effects) DropFetches() {
	// The cancelled fetches still answer through ev (their slots in the
	// queue are freed there), each with ctx's error.
	n := e.n
	n.cancelFetch()
	n.fetchCtx, n.cancelFetch = context.WithCancel(e.ctx)
	n.fetches.drop()
}

func (e effects) Fetch(anns []p2p.Announcement) {
	e.n.fetches.waiting = append(e.n.fetches.waiting, anns...)
	e.n.startFetches(e.ctx, e.ev)
}

func (e effects) Report(peers []coordinator.Pubkey) {
	for _, k := range peers {
		e.n.net.ReportPeer(k, "equivocation")
	}
}

func (e effects) Checked(reports []machine.ReportChecked) {
	for _, r := range reports {
		if r.Why == "" {
			e.n.cfg.log.Debug("loss report checked", "trainer", r.Trainer.Signer.String(), "step", r.Step, "ok", true)
		} else {
			e.n.cfg.log.Debug("loss report checked", "trainer", r.Trainer.Signer.String(), "step", r.Step, "ok", false, "why", r.Why)
		}
	}
}

func (e effects) Refused(results []machine.RefusedResult) {
	for _, r := range results {
		e.n.cfg.metrics.ResultsRefused.Inc()
		e.n.cfg.log.Warn("result refused: no work of its own", "trainer", r.Trainer.Signer.String(), "step", r.Step, "why", r.Why)
		e.n.net.ReportPeer(r.Trainer.P2P, "copied result")
	}
}

func (e effects) Pull(step uint32) {
	n, ctx := e.n, e.ctx
	working := n.cfg.clock.Work() // until Run has taken the answer
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		list, err := n.net.Pull(pctx, step)
		if err != nil {
			n.cfg.log.Debug("pull", "step", step, "err", err)
		}
		select {
		case e.ev.pulled <- pullResult{list: list, done: working}:
		case <-ctx.Done():
			working()
		}
	}()
}

func (e effects) Share(epoch uint32) {
	e.n.finishAhead() // a gradient trained ahead for a round that never came
	e.n.shareModel(e.ctx, epoch)
}

func (e effects) Save(w machine.SaveWork) {
	e.n.finishAhead()
	if e.n.cfg.checkpoints != "" {
		e.n.saveCheckpoint(e.ctx, w)
	}
}

func (e effects) Tick() { e.n.sendTick(e.ctx, e.ev) }
