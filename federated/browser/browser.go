package browser

import (
	"context"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/federated/fedclient"
)

// Config is what the page hands the client.
type Config struct {
	Server string   `json:"server"` // the server's base URL (the page's origin)
	Run    string   `json:"run"`
	Name   string   `json:"name"` // the text file's name, for messages
	Seed   [32]byte `json:"-"`    // the client key's ed25519 seed
	Batch  int      `json:"batch"`
	Rounds uint64   `json:"rounds"` // leave at this round (0: when the run finishes)
}

// DefaultBatch is psyche join --local-data's default: sequences a step.
const DefaultBatch = 4

// Event is one thing the page shows. Kind says which fields are set:
// "joined" (the key, the model, the data, the run's settings), "step" (a
// local training step), "round" (a round ended: losses, bytes, privacy),
// "done" (the run finished or reached Rounds), "error" (Error).
type Event struct {
	Kind string `json:"kind"`

	Address       string `json:"address,omitempty"` // the client's key (base58)
	Params        int    `json:"params,omitempty"`
	TrainTokens   int    `json:"train_tokens,omitempty"`
	HeldoutTokens int    `json:"heldout_tokens,omitempty"`
	Compressed    bool   `json:"compressed,omitempty"` // updates go as DisTrO frames
	SecAgg        bool   `json:"secagg,omitempty"`
	Privacy       string `json:"privacy,omitempty"` // none, central DP, local DP
	Aggregation   string `json:"aggregation,omitempty"`
	RoundSteps    uint32 `json:"round_steps,omitempty"`

	Step      int     `json:"step,omitempty"` // 1-based, within the round
	StepLoss  float32 `json:"step_loss,omitempty"`
	FirstStep float64 `json:"first_step_ms,omitempty"` // from Run's start to the first trained step

	Round        uint64   `json:"round"`
	HeldoutLoss  float32  `json:"heldout_loss,omitempty"`
	TrainLoss    float32  `json:"train_loss,omitempty"`
	Sent         int64    `json:"sent,omitempty"` // bytes of updates sent so far
	Stale        bool     `json:"stale,omitempty"`
	TokensPerSec float64  `json:"tokens_per_s,omitempty"`
	Epsilon      *float64 `json:"epsilon,omitempty"`
	EpsilonLocal *float64 `json:"epsilon_local,omitempty"`
	Delta        float64  `json:"delta,omitempty"`

	Error string `json:"error,omitempty"`
}

// Run takes part in cfg's run with text until ctx ends, the run finishes or
// cfg.Rounds is reached, telling emit what happens (emit is called from
// Run's goroutine).
func Run(ctx context.Context, cfg Config, text []byte, emit func(Event)) error {
	began := time.Now()
	key := chain.KeypairFromSeed(cfg.Seed)
	c := fedclient.New(cfg.Server, cfg.Run, key)
	m, err := c.RunModel(ctx)
	if err != nil {
		return err
	}
	t, opts, err := fedclient.ForRun(m, cfg.Name, text, batchOf(cfg), key.Public())
	if err != nil {
		return err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return err
	}
	emit(Event{Kind: "joined", Address: key.Public().String(), Params: len(t.Model.Params), TrainTokens: len(t.Data.Train),
		HeldoutTokens: len(t.Data.Heldout), Compressed: opts.Distro != nil, SecAgg: info.SecAgg, Privacy: privacy(info.NoiseMultiplier, info.LocalNoiseMultiplier),
		Aggregation: info.Aggregation, RoundSteps: info.RoundDuration, Round: info.Round})
	var first float64
	step := 0
	t.OnStep = func(loss float32) {
		step++
		if first == 0 {
			first = float64(time.Since(began).Microseconds()) / 1e3
		}
		emit(Event{Kind: "step", Step: step, StepLoss: loss, FirstStep: first})
	}
	var sent int64
	opts.Rounds = cfg.Rounds
	opts.OnRound = func(r fedclient.Round) {
		step = 0
		sent += int64(r.Sent)
		ev := Event{Kind: "round", Round: r.Round, HeldoutLoss: r.HeldoutLoss, TrainLoss: r.TrainLoss, Sent: sent, Stale: r.Stale,
			Epsilon: r.Info.Epsilon, EpsilonLocal: r.Info.EpsilonLocal, Delta: r.Info.Delta}
		if r.TrainTime > 0 {
			ev.TokensPerSec = float64(r.Tokens) / r.TrainTime.Seconds()
		}
		emit(ev)
	}
	if err := fedclient.Participate(ctx, c, t, opts); err != nil {
		return err
	}
	emit(Event{Kind: "done"})
	return nil
}

func batchOf(cfg Config) int {
	if cfg.Batch > 0 {
		return cfg.Batch
	}
	return DefaultBatch
}

func privacy(central, local float32) string {
	switch {
	case central > 0 && local > 0:
		return "central and local DP"
	case central > 0:
		return "central DP"
	case local > 0:
		return "local DP"
	}
	return "none"
}

// Bench trains steps local steps of cfg's run's model on text and returns
// the tokens trained a second: the figure the page and the native build
// are compared by (the first step is left out of the timing: it allocates).
func Bench(ctx context.Context, cfg Config, text []byte, steps int) (float64, error) {
	key := chain.KeypairFromSeed(cfg.Seed)
	m, err := fedclient.New(cfg.Server, cfg.Run, key).RunModel(ctx)
	if err != nil {
		return 0, err
	}
	t, _, err := fedclient.ForRun(m, cfg.Name, text, batchOf(cfg), key.Public())
	if err != nil {
		return 0, err
	}
	params := append([]float32(nil), t.Model.Params...)
	if _, _, err := t.TrainRound(params, 1); err != nil {
		return 0, err
	}
	began := time.Now()
	if _, _, err := t.TrainRound(params, steps); err != nil {
		return 0, err
	}
	return float64(steps*t.Batch*t.SeqLen) / time.Since(began).Seconds(), nil
}
