package main

import (
	"fmt"
	"strings"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/parity"
	"github.com/urfave/cli/v2"
)

var parityCommand = &cli.Command{
	Name:  "parity",
	Usage: "train one model with AdamW on one node and with DisTrO on simulated peers, and compare",
	Description: `Trains the same GPT on the same tokens twice: with AdamW on the whole batch, and
with the DisTrO optimizer on --peers simulated peers that each take an equal share
of every batch and exchange only encoded frames. Prints validation loss at equal
tokens, bytes sent per peer per step against a dense fp32 gradient, tokens/s, and
the achieved GFLOP/s against this build's matmul rate. The data is the embedded
Opticks text (byte tokens) unless --data names a token file; the last tenth of the
tokens is held out for validation.`,
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "steps", Value: 300, Usage: "optimizer steps of each run", Category: "RUN"},
		&cli.IntFlag{Name: "batch", Value: 16, Usage: "sequences per step, over all peers", Category: "RUN"},
		&cli.IntFlag{Name: "peers", Value: 4, Usage: "simulated DisTrO peers", Category: "RUN"},
		&cli.IntFlag{Name: "seq-len", Value: 64, Usage: "tokens per sequence", Category: "RUN"},
		&cli.IntFlag{Name: "eval-every", Value: 50, Usage: "steps between validation evaluations", Category: "RUN"},
		&cli.IntFlag{Name: "eval-seqs", Value: 64, Usage: "validation sequences per evaluation", Category: "RUN"},
		&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the initial weights and the data order", Category: "RUN"},
		// The defaults are the model psyche localnet trains (~120k parameters).
		&cli.IntFlag{Name: "width", Value: 64, Usage: "model width (d_model)", Category: "MODEL"},
		&cli.IntFlag{Name: "layers", Value: 2, Usage: "transformer blocks", Category: "MODEL"},
		&cli.IntFlag{Name: "heads", Value: 4, Usage: "attention heads", Category: "MODEL"},
		&cli.Float64Flag{Name: "adam-lr", Value: 3e-3, Usage: "peak AdamW learning rate", Category: "OPTIMIZER"},
		&cli.Float64Flag{Name: "distro-lr", Usage: "peak DisTrO learning rate (0: 0.256/width, which measured best at widths 64 and 128 and near best at 384: sign descent wants a rate that falls with the width)", Category: "OPTIMIZER"},
		&cli.Float64Flag{Name: "decay", Value: 0.97, Usage: "DisTrO momentum decay (compression_decay)", Category: "OPTIMIZER"},
		&cli.IntFlag{Name: "chunk", Value: 64, Usage: "DisTrO compression_chunk", Category: "OPTIMIZER"},
		&cli.IntFlag{Name: "topk", Value: 16, Usage: "DisTrO compression_topk", Category: "OPTIMIZER"},
		&cli.BoolFlag{Name: "one-bit", Value: true, Usage: "send 1-bit signs instead of float32 values", Category: "OPTIMIZER"},
		&cli.Float64Flag{Name: "clip", Value: 1, Usage: "DisTrO clip_grad_norm, like AdamW's (0: off)", Category: "OPTIMIZER"},
		&cli.Float64Flag{Name: "weight-decay", Usage: "DisTrO weight_decay", Category: "OPTIMIZER"},
		&cli.StringFlag{Name: "aggregation", Value: distro.AggregateRobust.String(), Usage: "how the peers' results combine: " + strings.Join(distro.AggregationNames(), ", ") + " (as a run's model.optimizer.aggregation)", Category: "OPTIMIZER"},
		&cli.Float64Flag{Name: "embed-lr-scale", Value: 1, Usage: "experiment: DisTrO lr multiplier of the embeddings (wte, wpe)", Category: "OPTIMIZER"},
		&cli.Float64Flag{Name: "adam-final-lr", Value: 0.1, Usage: "AdamW's rate at the last step as a fraction of its peak", Category: "OPTIMIZER"},
		&cli.Float64Flag{Name: "distro-final-lr", Value: 0.1, Usage: "DisTrO's rate at the last step as a fraction of its peak (a run sets the rate itself as [model.lr] final)", Category: "OPTIMIZER"},
		&cli.StringFlag{Name: "momentum-lr", Value: "scheduled", Usage: "experiment: the rate DisTrO folds gradients into its momentum at: scheduled (DeMo's), peak, held (scheduled during the warmup, then the peak), or squared (scheduled times its fraction of the peak); the step always follows the schedule", Category: "OPTIMIZER"},
		&cli.Float64Flag{Name: "vector-lr-scale", Value: 1, Usage: "experiment: DisTrO lr multiplier of layer norms and biases", Category: "OPTIMIZER"},
		&cli.StringFlag{Name: "update", Value: distro.UpdateSign.String(), Usage: "how the decoded aggregate becomes a step: " + strings.Join(distro.UpdateRuleNames(), ", ") + " (an experiment: a run always uses sign)", Category: "OPTIMIZER"},
		&cli.BoolFlag{Name: "normalize", Value: true, Usage: "divide each gradient coefficient by its own running RMS before DisTrO's momentum (as a run's model.optimizer.normalize = \"rms\"; --normalize=false: DeMo's raw gradients)", Category: "OPTIMIZER"},
		&cli.BoolFlag{Name: "rice", Value: true, Usage: "send indices as Rice codes of their gaps (--rice=false: the specification's fixed widths, docs/architecture.md §6)", Category: "OPTIMIZER"},
		&cli.StringFlag{Name: "data", Usage: "token file (default: the embedded Opticks text)", Category: "DATA"},
		&cli.IntFlag{Name: "token-size", Value: 2, Usage: "bytes per token of --data (2 or 4)", Category: "DATA"},
	},
	Action: runParity,
}

func runParity(c *cli.Context) error {
	ctx := c.Context
	seqLen := c.Int("seq-len")
	var tokens []uint32
	if path := c.String("data"); path != "" {
		var err error
		if tokens, err = data.ReadTokenFile(ctx, path, c.Int("token-size")); err != nil {
			return err
		}
	} else {
		tokens = data.Tokenize(data.Opticks())
	}
	cut := len(tokens) * 9 / 10
	open := func(toks []uint32, opts ...data.Option) (*data.Provider, error) {
		enc, err := data.EncodeTokens(nil, toks, data.TokenSize32)
		if err != nil {
			return nil, err
		}
		return data.NewProvider(ctx, data.NewBytesSource(enc), data.TokenSize32, seqLen, opts...)
	}
	train, err := open(tokens[:cut], data.WithShuffleSeed(c.Uint64("seed")))
	if err != nil {
		return fmt.Errorf("training data: %w", err)
	}
	val, err := open(tokens[cut:])
	if err != nil {
		return fmt.Errorf("validation data: %w", err)
	}
	vocab := 256
	for _, t := range tokens {
		vocab = max(vocab, int(t)+1)
	}
	agg, ok := distro.ParseAggregation(c.String("aggregation"))
	if !ok {
		return fmt.Errorf("--aggregation %q: want one of %s", c.String("aggregation"), strings.Join(distro.AggregationNames(), ", "))
	}
	upd, ok := distro.ParseUpdateRule(c.String("update"))
	if !ok {
		return fmt.Errorf("--update %q: want one of %s", c.String("update"), strings.Join(distro.UpdateRuleNames(), ", "))
	}
	mlr, err := parity.ParseMomentumLR(c.String("momentum-lr"))
	if err != nil {
		return fmt.Errorf("--momentum-lr: %w", err)
	}
	var finals [2]float32
	for i, name := range []string{"adam-final-lr", "distro-final-lr"} {
		finals[i] = float32(c.Float64(name))
		if !(finals[i] >= 0 && finals[i] <= 1) {
			return fmt.Errorf("--%s %g: want a fraction of the peak in [0, 1]", name, finals[i])
		}
	}
	distroLR := c.Float64("distro-lr")
	if distroLR == 0 {
		distroLR = parity.DefaultDistroLR(c.Int("width"))
	}
	cfg := parity.Config{
		Model:  gpt.Config{Vocab: vocab, Context: seqLen, Width: c.Int("width"), Layers: c.Int("layers"), Heads: c.Int("heads")},
		SeqLen: seqLen, Batch: c.Int("batch"), Peers: c.Int("peers"), Steps: c.Int("steps"),
		WarmupSteps: max(1, c.Int("steps")/15),
		AdamLR:      float32(c.Float64("adam-lr")), DistroLR: float32(distroLR),
		Distro: distro.Options{Chunk: c.Int("chunk"), TopK: c.Int("topk"), Quantize1Bit: c.Bool("one-bit"),
			RiceIndices: c.Bool("rice"), ClipGradNorm: float32(c.Float64("clip")), WeightDecay: float32(c.Float64("weight-decay")), Decay: float32(c.Float64("decay")), Aggregation: agg, Update: upd, NormalizeRMS: c.Bool("normalize"), Workers: 2},
		EmbedLRScale: float32(c.Float64("embed-lr-scale")), VectorLRScale: float32(c.Float64("vector-lr-scale")),
		MomentumLR: mlr, AdamFinalLR: &finals[0], DistroFinalLR: &finals[1],
		EvalEvery: c.Int("eval-every"), EvalSeqs: min(c.Int("eval-seqs"), int(val.NumSequences())), Seed: c.Uint64("seed"),
	}
	out := c.App.Writer
	fmt.Fprintf(out, "parity: %d-parameter model, %d steps of %d×%d tokens, AdamW lr %g (final ×%g), %d DisTrO peers (lr %g, chunk %d, top-k %d, 1-bit %v, Rice-coded indices %v, clip %g, weight decay %g, normalized %v, aggregation %s, update %s, momentum rate %s, final rate ×%g)\n",
		cfg.Model.NumParams(), cfg.Steps, cfg.Batch, seqLen, cfg.AdamLR, finals[0], cfg.Peers, cfg.DistroLR, cfg.Distro.Chunk, cfg.Distro.TopK, cfg.Distro.Quantize1Bit, cfg.Distro.RiceIndices, cfg.Distro.ClipGradNorm, cfg.Distro.WeightDecay, cfg.Distro.NormalizeRMS, cfg.Distro.Aggregation, cfg.Distro.Update, cfg.MomentumLR, finals[1])
	res, err := parity.Run(ctx, cfg, train, val, out)
	if err != nil {
		return err
	}
	res.Print(out)
	return nil
}
