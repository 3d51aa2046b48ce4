package fedclient

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/dp"
)

// Round is what a client reports after each round it took part in.
type Round struct {
	Round       uint64  // the round of the model it measured
	HeldoutLoss float32 // that model's loss on its held-out text
	TrainLoss   float32 // its mean training loss this round (0 before it trained)
	Sent        int     // bytes of the update it pushed
	Stale       bool    // its update was refused as stale
	// Tokens it trained on this round, in TrainTime (0 before it trained).
	Tokens    int
	TrainTime time.Duration
	// Info is the run's state as the client last read it this round: the
	// privacy spent so far (ε), the aggregation, whether updates go masked.
	Info federated.Info
}

// Options tunes Participate.
type Options struct {
	// Rounds stops after the server's round reaches it (0: until the run
	// finishes).
	Rounds uint64
	Log    *slog.Logger
	// OnRound is called after every held-out measurement.
	OnRound func(Round)
	// SecAgg stops the client mid-round in tests.
	SecAgg SecAggHooks
	// JoinToken is the run's join authority's token for this client's key
	// (federated.JoinToken); nil for a run without a join authority.
	JoinToken []byte
	// Distro, for a run whose optimizer is DisTrO, compresses each update
	// into a frame (its momentum is the error feedback: what a round's
	// frame leaves out is sent later); federated.Distro builds it.
	Distro *distro.DeMo
}

// Participate is a client's loop: fetch the model, measure the held-out
// loss, train a round, push the update (clipped and noised when the run
// asks for local DP), and wait for the next round. A stale refusal makes
// it fetch the current model and train again; a paused run or an
// unreachable server (a restart) makes it wait and retry.
func Participate(ctx context.Context, c *Client, t *Trainer, o Options) error {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	backoff := func(try int) time.Duration { return min(100*time.Millisecond<<min(try, 5), 3*time.Second) }
	wait := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	after := int64(-1)
	failures := 0
	joined := false
	retry := func(what string, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		failures++
		if failures == 1 || failures%20 == 0 {
			log.Warn("federated: "+what+" failed; retrying", "err", err, "tries", failures)
		}
		return wait(backoff(failures))
	}
	for {
		if !joined {
			// Only members push: join first (again, should the server
			// say this key is no member).
			if _, err := c.Join(ctx, o.JoinToken); err != nil {
				if errors.Is(err, ErrRefused) {
					return err
				}
				if err := retry("joining the run", err); err != nil {
					return err
				}
				continue
			}
			joined = true
		}
		info, err := c.Info(ctx)
		if err != nil {
			if err := retry("asking for the run's state", err); err != nil {
				return err
			}
			continue
		}
		round, params, err := c.Model(ctx, after)
		if errors.Is(err, ErrNoRound) {
			continue
		}
		if err != nil {
			if err := retry("fetching the model", err); err != nil {
				return err
			}
			continue
		}
		failures = 0
		loss, err := t.HeldoutLoss(params)
		if err != nil {
			return err
		}
		log.Info("federated heldout loss", "round", round, "loss", loss, "data", t.Data.Path)
		rep := Round{Round: round, HeldoutLoss: loss, Info: *info}
		if info.Finished || (o.Rounds > 0 && round >= o.Rounds) {
			if o.OnRound != nil {
				o.OnRound(rep)
			}
			log.Info("federated run done", "round", round)
			return nil
		}
		began := time.Now()
		delta, trainLoss, err := t.TrainRound(params, int(info.RoundDuration))
		if err != nil {
			return err
		}
		rep.TrainLoss, rep.TrainTime = trainLoss, time.Since(began)
		rep.Tokens = int(info.RoundDuration) * t.Batch * t.SeqLen
		if info.LocalNoiseMultiplier > 0 || (info.SecAgg && info.Clip > 0) {
			dp.Clip(delta, float64(info.Clip))
		}
		if info.LocalNoiseMultiplier > 0 {
			var seed [32]byte
			if _, err := rand.Read(seed[:]); err != nil {
				return err
			}
			dp.NewNoise(seed).Add(delta, float64(info.LocalNoiseMultiplier)*float64(info.Clip))
		}
		if info.SecAgg {
			n, err := c.SecAggRound(ctx, round, delta, info.Clip, int(info.SecAggThreshold), int(info.SecAggNeighbors), o.SecAgg)
			rep.Sent += n
			var stale *StaleError
			switch {
			case err == nil:
				log.Info("federated masked update revealed", "base", round, "bytes", rep.Sent, "train_loss", trainLoss)
				after = int64(round)
			case errors.As(err, &stale), errors.Is(err, ErrAborted):
				log.Warn("secure aggregation round missed; fetching the current model", "base", round, "err", err)
				rep.Stale = true
				after = -1
			case errors.Is(err, ErrPaused):
				if err := wait(time.Second); err != nil {
					return err
				}
				after = -1
			case errors.Is(err, federated.ErrFinished):
				return nil
			default:
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if o.SecAgg.AfterShares != nil {
					return err // a test's dropout
				}
				if err := retry("secure aggregation", err); err != nil {
					return err
				}
				after = -1
			}
			if o.OnRound != nil {
				o.OnRound(rep)
			}
			continue
		}
		var frame []byte
		if o.Distro != nil {
			// DisTrO's step is δ ← β·δ + g, sent as sign(−IDCT(top-k)) by
			// the server's reading: the "gradient" is the negated update.
			g := make([][]float32, 0, len(t.Model.Tensors()))
			at := 0
			for _, tensor := range t.Model.Tensors() {
				part := make([]float32, len(tensor))
				for i := range part {
					part[i] = -delta[at+i]
				}
				at += len(tensor)
				g = append(g, part)
			}
			f, err := o.Distro.Step(g, 1)
			if err != nil {
				return err
			}
			if frame, err = f.MarshalBinary(); err != nil {
				return err
			}
		}
		for {
			push := func() (*federated.PushResult, int, error) {
				if frame != nil {
					return c.PushFrame(ctx, round, info.RoundDuration, frame)
				}
				return c.Push(ctx, round, info.RoundDuration, delta)
			}
			res, n, err := push()
			rep.Sent += n
			var stale *StaleError
			switch {
			case err == nil:
				log.Info("federated update accepted", "base", round, "round", res.Round, "buffered", res.Buffered,
					"capacity", res.Capacity, "bytes", n, "train_loss", trainLoss)
				after = int64(round)
			case errors.Is(err, federated.ErrDuplicate):
				// An earlier try got through before its answer was lost
				// (a server restart): the update is in.
				log.Info("federated update already accepted", "base", round)
				after = int64(round)
			case errors.Is(err, federated.ErrFinished):
				log.Info("federated run done", "round", round)
				return nil
			case errors.As(err, &stale):
				log.Warn("federated update refused as stale; fetching the current model", "base", round, "round", stale.Round)
				rep.Stale = true
				after = -1
			case errors.Is(err, ErrPaused):
				log.Info("federated run paused; waiting", "round", round)
				if err := wait(time.Second); err != nil {
					return err
				}
				continue
			case errors.Is(err, federated.ErrNotMember):
				log.Warn("the server does not know this key as a member; joining again", "round", round)
				joined = false
				if _, err := c.Join(ctx, o.JoinToken); err != nil {
					return err
				}
				joined = true
				continue
			default:
				if err := retry("pushing the update", err); err != nil {
					return err
				}
				if failures > 50 {
					return fmt.Errorf("fedclient: pushing the update: %w", err)
				}
				continue
			}
			break
		}
		failures = 0
		if o.OnRound != nil {
			o.OnRound(rep)
		}
	}
}
