package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/localrun"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/urfave/cli/v2"
)

var localnetCommand = &cli.Command{
	Name:  "localnet",
	Usage: "run a whole training run on this machine: the embedded server (or a local Solana validator) and N trainers",
	Description: `Starts the server backend and --trainers trainers on 127.0.0.1, each with its own
libp2p host, and trains a small GPT on the bundled Opticks text (or, with --run, a
run file's model on its data) with DisTrO for --epochs epochs: the trainers join,
warm up, train their assigned batches, exchange compressed results over libp2p,
witness each other, apply the consensus results and record checkpoints, exactly as
separate machines would. Ends with a summary: the held-out loss before and after,
whether each engine's trainers hold identical weights, and, with several engines,
how far the engines' weights differ.

With --solana the run lives in the coordinator program on a local Solana validator
(the one psyche validator starts; it needs Node 20): every instruction is a signed
transaction, and the trainers tick the run themselves.

With --virtual-time the run's clock (the server's, or the validator's Clock sysvar)
moves a second only once the backend and every trainer have had nothing to do for
a moment: timeouts then measure waiting, never computing, so an epoch holds the
same number of steps on a slow or busy machine as on a fast one. A run that never
waits (rounds back to back) still spends a second on each round during which its
clock did not move, so that its epochs end. The tests use it. On the embedded server
such a run is repeatable: the server draws each round's seed from --seed and the run's
state, and the trainers join in order, so the same --seed ends at the same weights
(the summary prints their hash).`,
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "trainers", Value: 3, Usage: "number of trainers (1-16)", Category: "RUN"},
		&cli.IntFlag{Name: "epochs", Value: 3, Usage: "epochs to train", Category: "RUN"},
		precisionFlag, engineFlag, deviceFlag, devicesFlag, pythonFlag, compileFlag, placementFlag, deviceMemoryFlag,
		&cli.IntFlag{Name: "epoch-time", Value: 20, Usage: "target epoch length in seconds", Category: "RUN"},
		&cli.StringFlag{Name: "dir", Usage: "working directory for state, data and checkpoints (default: a new temporary one)", Category: "RUN"},
		&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the initial weights", Category: "RUN"},
		&cli.IntFlag{Name: "batch", Value: 12, Usage: "sequences (of 64 tokens) each trainer trains per round", Category: "RUN"},
		&cli.BoolFlag{Name: "solana", Usage: "run the coordinator program on a local Solana validator instead of the embedded server", Category: "RUN"},
		&cli.StringFlag{Name: "aggregation", Value: "robust", Usage: "how trainers combine a round's results: robust, mean or clipped-mean", Category: "RUN"},
		&cli.BoolFlag{Name: "quantize", Value: true, Usage: "send 1-bit signs (false: float32 values)", Category: "RUN"},
		&cli.BoolFlag{Name: "virtual-time", Usage: "the run's clock moves only while every trainer waits (timeouts never race compute)", Category: "RUN"},
		&cli.StringFlag{Name: "run", Usage: "train the [model] of this run file (architecture, shape, schedule, optimizer; its checkpoint url must be seed:N, or for a transformers run a checkpoint directory, file:///DIR) on its data (builtin:opticks or a token file: localnet holds its last tenth out for the summary's loss) instead of the small GPT; --aggregation and --quantize, when given, override its optimizer", Category: "RUN"},
		&cli.BoolFlag{Name: "non-iid", Usage: "lay the data out so that, round by round, one trainer's batch is the text read backwards while the others read it forwards: honest trainers whose data differ (for checking that verification and robust aggregation accuse none of them)", Category: "RUN"},
		&cli.IntFlag{Name: "verification-percent", Usage: "the share of each round's trainers whose results the witnesses score (0-100; the run file's verification_percent): a trainer whose results do no work on its data is dropped", Category: "RUN"},
		&cli.IntFlag{Name: "drop-trainer-at", Usage: "stop the last trainer once the run reaches this step, to watch the others drop it (0: never)", Category: "RUN"},
		&cli.StringFlag{Name: "explorer-addr", Value: "127.0.0.1:0", Usage: "serve the run explorer on this address while the run lasts (port 0: any free port; empty: no explorer)", Category: "EXPLORER"},
	},
	Action: localnet,
}

// virtualSettle is how long (real time) a --virtual-time run must have been
// idle before its clock moves: enough for a message in flight between two
// trainers, or a snapshot on its way to them, on a loaded machine.
const virtualSettle = 100 * time.Millisecond

// localnetModel is the model localnet trains without --run: about 120k
// parameters.
var localnetModel = gpt.Config{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4}

// localnetRunModel is the run's model: localnet's own, or with --run the
// run file's [model], whose checkpoint must be drawn from a seed (every
// trainer draws it; localnet writes no model file), or be a transformers
// run's checkpoint directory (every trainer reads it). Its data,
// builtin:opticks or a token file, is what prepareLocalFiles reads. The
// batch each trainer trains per round is --batch, or, with a run file that
// has a [config] and no --batch, its global batch shared by the trainers
// (a run file sized for its model fits its rounds).
func localnetRunModel(c *cli.Context) (*coordinator.Model, uint64, int, error) {
	m, seed, perTrainer, err := localnetRunFile(c)
	if err != nil {
		return nil, 0, 0, err
	}
	if c.IsSet("batch") || perTrainer == 0 {
		perTrainer = c.Int("batch")
	}
	return m, seed, perTrainer, nil
}

func localnetRunFile(c *cli.Context) (*coordinator.Model, uint64, int, error) {
	seed := c.Uint64("seed")
	m := &coordinator.Model{DataKind: coordinator.DataLocal, TokenSize: 2,
		LR:        coordinator.LRSchedule{Kind: coordinator.LRConstant, BaseLR: 4e-3, WarmupSteps: 5},
		Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64, Quantize1Bit: true, ClipGradNorm: 1}}
	modelspec.SetGPT(m, localnetModel)
	_ = coordinator.SetFixedString(m.DataLocation[:], data.BuiltinPrefix+"opticks")
	path := c.String("run")
	if path == "" {
		return m, seed, 0, nil
	}
	u, err := loadRunFile(path)
	if err != nil {
		return nil, 0, 0, err
	}
	if u.Model == nil {
		return nil, 0, 0, fmt.Errorf("--run %s: the file has no [model]", path)
	}
	src, err := modelspec.ParseSource(coordinator.FixedString(u.Model.Checkpoint.Source.URL[:]))
	fromDir := err == nil && src.Kind == modelspec.FromFile && u.Model.Architecture == coordinator.ArchTransformers
	if (err != nil || src.Kind != modelspec.FromSeed) && !fromDir {
		return nil, 0, 0, fmt.Errorf("--run %s: localnet draws the model from a seed: model.checkpoint.url must be seed:N (or, for a transformers run, a checkpoint directory: file:///DIR)", path)
	}
	if fromDir {
		// The weights are the directory's; --seed still seeds the rounds.
		src.Seed = seed
	}
	if _, err := modelspec.ModelConfig(u.Model); err != nil {
		return nil, 0, 0, fmt.Errorf("--run %s: %w", path, err)
	}
	perTrainer := 0
	if u.Config != nil {
		perTrainer = max(1, int(u.Config.GlobalBatchSizeEnd)/c.Int("trainers"))
	}
	return u.Model, src.Seed, perTrainer, nil
}

// localnet runs a whole run on this machine, in named steps: check the
// flags, prepare the data and the initial model, start the backend, create
// the run, start the trainers, follow the run until enough epochs have
// passed, then stop everything and summarize.
func localnet(c *cli.Context) (err error) {
	n, epochs := c.Int("trainers"), c.Int("epochs")
	if err := checkLocalnetFlags(c); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := c.App.Writer
	log := logger(c)
	if c.String("log-level") == "info" {
		log = slog.New(slog.DiscardHandler) // the progress lines say what matters; --log-level debug shows everything
	}
	dir, err := localnetDir(c.String("dir"))
	if err != nil {
		return err
	}
	if c.String("dir") == "" {
		// A directory of our own that a failed run leaves nothing useful
		// in (one that ends well keeps it: the summary names its files).
		defer func() {
			if err != nil {
				_ = os.RemoveAll(dir)
			}
		}()
	}
	kinds, err := engineKinds(c, true)
	if err != nil {
		return err
	}
	model, seed, perTrainer, err := localnetRunModel(c)
	if err != nil {
		return err
	}
	if model.Architecture == coordinator.ArchTransformers && contains(kinds, "go") {
		return fmt.Errorf("--run %s: a Hugging Face transformers model trains only on the torch engine: use --engine torch", c.String("run"))
	}
	// Before anything starts: python and torch are there when asked for.
	if prec, err := precision(c); err != nil {
		return err
	} else if err := checkEngines(ctx, c, kinds, prec); err != nil {
		return err
	} else if model.Architecture == coordinator.ArchTransformers {
		// What each trainer checks before joining, checked once here
		// before localnet draws the model: a config that does not fit
		// is refused before it is allocated.
		op, err := newTorch(c, prec, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		if err := op.CheckModel(ctx, model); err != nil {
			return fmt.Errorf("--run %s: %w", c.String("run"), err)
		}
	}
	files, err := prepareLocalFiles(ctx, dir, model, seed)
	if err != nil {
		return err
	}
	if c.Bool("non-iid") {
		if err := files.nonIID(ctx, int(model.MaxSeqLen), perTrainer, c.Int("trainers")); err != nil {
			return err
		}
	}

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	runID := fmt.Sprintf("localnet-%d", time.Now().Unix())
	keys := localrun.Keys{Prefix: "localnet", Suffix: runID}
	admin := keys.Admin()
	signers := make([]*chain.Keypair, n)
	for i := range signers {
		signers[i] = keys.Trainer(i)
	}
	lb, err := startLocalBackend(ctx, runCtx, dir, log, c.Bool("solana"), c.Bool("virtual-time"), seed, admin.Public(), append([]*chain.Keypair{admin}, signers...))
	if err != nil {
		return err
	}
	if lb.close != nil {
		defer lb.close()
	}
	tune := func(k *coordinator.Config, m *coordinator.Model) {
		if c.Int("drop-trainer-at") > 0 {
			// The next epoch starts without the trainer that is stopped.
			k.InitMinClients = uint16(n - 1)
		}
		if c.String("run") == "" || c.IsSet("aggregation") {
			m.Optimizer.Aggregation = coordinator.Aggregation(aggregationNames[c.String("aggregation")])
		}
		if c.String("run") == "" || c.IsSet("quantize") {
			m.Optimizer.Quantize1Bit = c.Bool("quantize")
		}
		if c.IsSet("verification-percent") {
			k.VerificationPercent = uint8(c.Int("verification-percent"))
		}
	}
	if v := c.Int("verification-percent"); v < 0 || v > 100 {
		return fmt.Errorf("--verification-percent %d: want 0 to 100", v)
	}
	run, err := localnetRun(runID, n, perTrainer, c.Int("epoch-time"), *model, files, tune)
	if err != nil {
		return err
	}
	if err := localrun.Create(ctx, lb.backend, run, admin); err != nil {
		return err
	}
	fmt.Fprintf(out, "localnet: run %s, %d trainers, %d-parameter %s, %d sequences per trainer per round, %s, files in %s\n",
		runID, n, files.Initial.NumParams(), modelspec.ArchTitle(model.Architecture), perTrainer, lb.where, dir)
	if err := startLocalExplorer(runCtx, c.String("explorer-addr"), out, log, lb, runID, epochs, files); err != nil {
		return err
	}
	if lb.clock != nil {
		fmt.Fprintln(out, "localnet: virtual time: the run's clock moves only while every trainer waits")
		go func() { _ = lb.clock.Run(runCtx, time.Second, virtualSettle) }()
	}

	// With -tags adversary, --adversary makes the last trainer misbehave
	// (scripts/bench-adversary); the others are the honest ones measured.
	var bad []node.Option
	if localnetAdversary != nil {
		if bad, err = localnetAdversary(c); err != nil {
			return err
		}
	}
	prec, err := precision(c)
	if err != nil {
		return err
	}
	engines := make([][]node.Option, len(kinds))
	for i, k := range kinds {
		if engines[i], err = engineOption(c, k, prec, log.With("trainer-engine", k)); err != nil {
			return err
		}
	}
	if len(kinds) > 1 || kinds[0] != "go" {
		fmt.Fprintf(out, "localnet: engines %s, one per trainer in turn\n", strings.Join(kinds, ","))
	}
	trainers, err := startTrainers(runCtx, runID, keys, n, lb.backend, dir, log, c.Bool("virtual-time"), bad, engines, append(lb.nodeOpts, node.WithPrecision(prec))...)
	if err != nil {
		return err
	}
	for i, t := range trainers {
		t.engine = kinds[i%len(kinds)]
	}
	honest := trainers
	if len(bad) > 0 {
		honest = trainers[:n-1]
		fmt.Fprintf(out, "localnet: trainer %d is adversarial (%s)\n", n-1, c.String("adversary"))
	}
	heap := watchHeap(runCtx)
	errs := make(chan error, n)
	for _, t := range trainers[:n-1] {
		go func() { errs <- t.Node.Run(runCtx) }()
	}
	drop := dropLast(runCtx, out, trainers[n-1], c.Int("drop-trainer-at"), errs)
	if c.Int("drop-trainer-at") > 0 && n > 1 {
		honest = slices.DeleteFunc(slices.Clone(honest), func(t *localTrainer) bool { return t == trainers[n-1] })
	}
	start := time.Now()
	onStep := drop
	if lb.clock != nil {
		// Rounds that end as soon as their witnesses are in follow each
		// other with no wait at all, so the clock would never move and no
		// epoch would end: each round that saw no advance costs a virtual
		// second when the next begins (an event, never a measure of real
		// time, so a slow machine plays the same rounds).
		onStep = func(s *coordinator.Coordinator) {
			lb.clock.Progressed()
			drop(s)
		}
	}
	last, rounds, err := followLocalRun(ctx, runCtx, out, lb.backend, runID, epochs, trainers, errs, onStep)
	if err != nil {
		return err
	}
	cancelRun()
	for range trainers {
		<-errs
	}
	<-lb.up
	if err := summarize(out, last, files.Initial, honest, files.heldOut, time.Since(start)); err != nil {
		return err
	}
	if ctx.Err() != nil && last != nil {
		// Interrupted: the trainers' weights are newer than the last
		// recorded checkpoint (which may still be the seed): keep them.
		if err := saveInterrupted(out, dir, runID, last, honest); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "peak heap: %s\n", bytesString(heap()))
	rounds.report(out, len(trainers))
	if c.String("dir") == "" {
		fmt.Fprintf(out, "files kept in %s (remove it when done with them)\n", dir)
	}
	return nil
}

func checkLocalnetFlags(c *cli.Context) error {
	n, epochs, epochTime := c.Int("trainers"), c.Int("epochs"), c.Int("epoch-time")
	switch {
	case n < 1 || n > 16:
		return fmt.Errorf("--trainers must be between 1 and 16, got %d", n)
	case epochs < 1:
		return fmt.Errorf("--epochs must be at least 1, got %d", epochs)
	case epochTime < 4:
		return fmt.Errorf("--epoch-time must be at least 4 seconds, got %d", epochTime)
	case c.Int("drop-trainer-at") < 0 || (c.Int("drop-trainer-at") > 0 && n < 2):
		return fmt.Errorf("--drop-trainer-at must be 0, or a step with at least 2 trainers (the others go on), got %d with %d", c.Int("drop-trainer-at"), n)
	case c.Int("drop-trainer-at") > 0 && c.Bool("solana") && c.Bool("virtual-time"):
		// Seen stalled: the virtual clock never moved again after the stop
		// (the others' work on the stopped trainer's round kept it busy).
		return fmt.Errorf("--drop-trainer-at does not work with --solana --virtual-time yet (the run's virtual clock stalls); drop one of them")
	case c.Int("batch") < 1 || c.Int("batch")*n > 65535:
		return fmt.Errorf("--batch must be between 1 and %d for %d trainers, got %d", 65535/n, n, c.Int("batch"))
	}
	if _, ok := aggregationNames[c.String("aggregation")]; !ok {
		return fmt.Errorf("--aggregation must be robust, mean or clipped-mean, not %q", c.String("aggregation"))
	}
	return nil
}

// localnetDir is the working directory: dir, or a new temporary one.
func localnetDir(dir string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", "psyche-localnet-")
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// localnetAdversary, set by the adversary build (localnet_adversary.go),
// returns the options that make the last trainer adversarial (none: all
// honest).
var localnetAdversary func(c *cli.Context) ([]node.Option, error)
