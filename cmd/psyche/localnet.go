package main

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/explorer"
	"github.com/psyche-go/psyche/internal/quietclock"
	"github.com/psyche-go/psyche/p2p/libp2p"
	program "github.com/psyche-go/psyche/programs/coordinator"
	"github.com/psyche-go/psyche/programs/validator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/start"
	"github.com/urfave/cli/v2"
)

var localnetCommand = &cli.Command{
	Name:  "localnet",
	Usage: "run a whole training run on this machine: the embedded server (or a local Solana validator) and N trainers",
	Description: `Starts the server backend and --trainers trainers on 127.0.0.1, each with its own
libp2p host, and trains a small GPT on the bundled Opticks text with DisTrO for
--epochs epochs: the trainers join, warm up, train their assigned batches, exchange
compressed results over libp2p, witness each other, apply the consensus results and
record checkpoints, exactly as separate machines would. Ends with a summary.

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
		precisionFlag, engineFlag, deviceFlag, devicesFlag, pythonFlag, compileFlag,
		&cli.IntFlag{Name: "epoch-time", Value: 20, Usage: "target epoch length in seconds", Category: "RUN"},
		&cli.StringFlag{Name: "dir", Usage: "working directory for state, data and checkpoints (default: a new temporary one)", Category: "RUN"},
		&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the initial weights", Category: "RUN"},
		&cli.IntFlag{Name: "batch", Value: 12, Usage: "sequences (of 64 tokens) each trainer trains per round", Category: "RUN"},
		&cli.BoolFlag{Name: "solana", Usage: "run the coordinator program on a local Solana validator instead of the embedded server", Category: "RUN"},
		&cli.StringFlag{Name: "aggregation", Value: "robust", Usage: "how trainers combine a round's results: robust, mean or clipped-mean", Category: "RUN"},
		&cli.BoolFlag{Name: "quantize", Value: true, Usage: "send 1-bit signs (false: float32 values)", Category: "RUN"},
		&cli.BoolFlag{Name: "virtual-time", Usage: "the run's clock moves only while every trainer waits (timeouts never race compute)", Category: "RUN"},
		&cli.StringFlag{Name: "run", Usage: "train the [model] of this run file (architecture, shape, schedule, optimizer; its checkpoint url must be seed:N) on its data (builtin:opticks or a token file: localnet holds its last tenth out for the summary's loss) instead of the small GPT; --aggregation and --quantize, when given, override its optimizer", Category: "RUN"},
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
// trainer draws it; localnet writes no model file). Its data,
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
	runmodel.SetGPT(m, localnetModel)
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
	src, err := runmodel.ParseSource(coordinator.FixedString(u.Model.Checkpoint.Source.URL[:]))
	if err != nil || src.Kind != runmodel.FromSeed {
		return nil, 0, 0, fmt.Errorf("--run %s: localnet draws the model from a seed: model.checkpoint.url must be seed:N", path)
	}
	if _, err := runmodel.ModelConfig(u.Model); err != nil {
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
	// Before anything starts: python and torch are there when asked for.
	if kinds, err := engineKinds(c, true); err != nil {
		return err
	} else if prec, err := precision(c); err != nil {
		return err
	} else if err := checkEngines(ctx, c, kinds, prec); err != nil {
		return err
	}
	model, seed, perTrainer, err := localnetRunModel(c)
	if err != nil {
		return err
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
	admin := chain.KeypairFromSeed(sha256.Sum256([]byte("localnet admin " + runID)))
	signers := make([]*chain.Keypair, n)
	for i := range signers {
		signers[i] = chain.KeypairFromSeed(sha256.Sum256([]byte(fmt.Sprintf("localnet trainer %d %s", i, runID))))
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
	if err := createLocalRun(ctx, lb.backend, runID, admin, n, perTrainer, c.Int("epoch-time"), *model, files, tune); err != nil {
		return err
	}
	fmt.Fprintf(out, "localnet: run %s, %d trainers, %d-parameter %s, %d sequences per trainer per round, %s, files in %s\n",
		runID, n, files.initial.NumParams(), archName(model.Architecture), perTrainer, lb.where, dir)
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
	kinds, err := engineKinds(c, true)
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
	trainers, err := startTrainers(runCtx, runID, signers, lb.backend, dir, log, c.Bool("virtual-time"), bad, engines, append(lb.nodeOpts, node.WithPrecision(prec))...)
	if err != nil {
		return err
	}
	honest := trainers
	if len(bad) > 0 {
		honest = trainers[:n-1]
		fmt.Fprintf(out, "localnet: trainer %d is adversarial (%s)\n", n-1, c.String("adversary"))
	}
	heap := watchHeap(runCtx)
	errs := make(chan error, n)
	for _, t := range trainers[:n-1] {
		go func() { errs <- t.node.Run(runCtx) }()
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
	if err := summarize(out, last, files.initial, honest, files.heldOut, time.Since(start)); err != nil {
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

// saveInterrupted writes the first honest trainer's model, the run's
// weights when it was interrupted, beside the run's other files and says
// where.
func saveInterrupted(out io.Writer, dir, runID string, s *coordinator.Coordinator, trainers []*localTrainer) error {
	m := trainers[0].node.Model()
	if m == nil {
		return nil
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-interrupted-step%d.safetensors", runID, s.Progress.Step))
	if err := m.Save(context.Background(), path, map[string]string{"run": runID, "step": fmt.Sprint(s.Progress.Step)}); err != nil {
		return fmt.Errorf("saving the weights at the interruption: %w", err)
	}
	fmt.Fprintf(out, "weights at the interruption: %s (newer than the checkpoint above)\n", path)
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

// localFiles are the run's data and initial model.
type localFiles struct {
	tokens    string   // path of the token file the trainers read
	tokenSize int      // its bytes per token
	heldOut   []uint32 // the last tenth of the data, never trained on
	seed      uint64   // the run starts from seed:seed, which every trainer draws
	initial   runmodel.Model
}

// prepareLocalFiles reads the run's data whole (builtin:opticks as byte
// tokens, or the token file model.data names, its tokens checked against
// the vocabulary), holds its last tenth out and writes the rest to a token
// file in dir for the trainers, and draws the initial model from seed as
// the trainers will, for the summary's before-and-after loss and the run's
// revision.
func prepareLocalFiles(ctx context.Context, dir string, model *coordinator.Model, seed uint64) (localFiles, error) {
	f := localFiles{tokens: filepath.Join(dir, "train.tokens"), tokenSize: data.TokenSize16, seed: seed}
	var tokens []uint32
	if loc := coordinator.FixedString(model.DataLocation[:]); loc == data.BuiltinPrefix+"opticks" {
		tokens = data.Tokenize(data.Opticks())
	} else {
		var err error
		if tokens, err = readRunTokens(ctx, loc, model); err != nil {
			return f, err
		}
		f.tokenSize = int(model.TokenSize)
	}
	cut := len(tokens) * 9 / 10
	f.heldOut = tokens[cut:]
	if err := data.WriteTokenFile(ctx, f.tokens, tokens[:cut], f.tokenSize); err != nil {
		return f, err
	}
	cfg, err := runmodel.ModelConfig(model)
	if err != nil {
		return f, err
	}
	f.initial, err = runmodel.New(cfg, seed, nil)
	return f, err
}

// nonIID rewrites the trainers' token file in blocks of one trainer's batch
// (perTrainer sequences of seqLen tokens): of every n blocks, the last is
// the text backwards, the others forwards. Trainers read sequences in file
// order (their data are not shuffled), and each round's global batch is n
// consecutive blocks shared out among the n trainers in an order the
// round's seed draws, so each round one trainer trains on backward text;
// the held-out loss stays the forward text's.
func (f *localFiles) nonIID(ctx context.Context, seqLen, perTrainer, n int) error {
	fwd, err := data.ReadTokenFile(ctx, f.tokens, f.tokenSize)
	if err != nil {
		return err
	}
	bwd := slices.Clone(fwd)
	slices.Reverse(bwd)
	block := seqLen * perTrainer
	mixed := make([]uint32, 0, len(fwd))
	for at := 0; at < len(fwd); at += block {
		src := fwd
		if (at/block)%n == n-1 {
			src = bwd
		}
		mixed = append(mixed, src[at:min(at+block, len(fwd))]...)
	}
	return data.WriteTokenFile(ctx, f.tokens, mixed, f.tokenSize)
}

// readRunTokens reads every token of the run's data at loc, as the trainers
// would read it (a local path is relative to the working directory), in
// file order: its sequences' inputs and the last one's target.
func readRunTokens(ctx context.Context, loc string, model *coordinator.Model) ([]uint32, error) {
	p, err := data.Open(ctx, loc, int(model.TokenSize), int(model.MaxSeqLen), data.WithVocabSize(model.VocabSize))
	if errors.Is(err, data.ErrNotFound) {
		return nil, fmt.Errorf("the run's data (model.data = %q) does not exist: make it first, as the run file's comments say (psyche data tokenize): %w", loc, err)
	}
	if err != nil {
		return nil, fmt.Errorf("the run's data (model.data = %q): %w", loc, err)
	}
	defer p.Close()
	seqLen := p.SeqLen()
	tokens := make([]uint32, 0, p.NumSequences()*uint64(seqLen)+1)
	var seq []uint32
	for i := range p.NumSequences() {
		if seq, err = p.Sequence(ctx, i, seq); err != nil {
			return nil, err
		}
		tokens = append(tokens, seq[:seqLen]...)
	}
	return append(tokens, seq[seqLen]), nil
}

// localBackend is a started backend and what the trainers need to use it.
type localBackend struct {
	backend  chain.Backend
	where    string
	nodeOpts []node.Option
	clock    *quietclock.Clock // nil: the wall clock
	server   *server.Server    // the embedded server (nil on Solana)
	up       chan error        // the backend's result once runCtx ends
	close    func()            // stops the validator, if any
}

// startLocalBackend starts the embedded server (on which only creator may
// create runs) or, with solana, the local validator with the coordinator
// program (funding the keys), on the wall clock or in virtual time. ctx
// bounds the start; runCtx the backend's life. In virtual time the server
// draws its round seeds from seed and the run's state (reproducibleSeed).
func startLocalBackend(ctx, runCtx context.Context, dir string, log *slog.Logger, solana, virtual bool, seed uint64, creator coordinator.Pubkey, fund []*chain.Keypair) (*localBackend, error) {
	lb := &localBackend{up: make(chan error, 1)}
	// Virtual time starts at the next whole second (both backends count
	// unix seconds), after the validator's clock started.
	newClock := func() *quietclock.Clock { return quietclock.New(time.Now().Truncate(time.Second).Add(time.Second)) }
	if solana {
		sb, v, err := startLocalSolana(runCtx, dir, log, virtual, fund)
		if err != nil {
			return nil, err
		}
		lb.close = func() { _ = v.Close() }
		go func() { lb.up <- v.Run(runCtx) }()
		lb.backend, lb.where = sb, "Solana validator "+v.RPC
		lb.nodeOpts = append(lb.nodeOpts, node.WithTicking())
		if virtual {
			lb.clock = newClock()
			if err := v.SetClock(ctx, lb.clock.Now()); err != nil {
				lb.close()
				return nil, err
			}
			lb.clock.OnAdvance(func(now time.Time) {
				if err := v.SetClock(runCtx, now); err != nil && runCtx.Err() == nil {
					log.Warn("moving the validator's clock", "err", err)
				}
			})
		}
	} else {
		// The server ticks when a transition falls due: no short interval needed.
		opts := []server.Option{server.WithLogger(log), server.WithCreators(creator)}
		if virtual {
			lb.clock = newClock()
			// The server ticks when the clock moves, not by itself.
			opts = []server.Option{server.WithManualTicks(), server.WithLogger(log), server.WithCreators(creator),
				server.WithClock(lb.clock.Now), server.WithStateSeeds(func(s *coordinator.Coordinator) uint64 { return reproducibleSeed(seed, s) })}
		}
		srv, err := server.New(filepath.Join(dir, "server"), opts...)
		if err != nil {
			return nil, err
		}
		if lb.clock != nil {
			lb.clock.OnAdvance(func(time.Time) { srv.Tick() })
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		go func() { lb.up <- srv.Serve(runCtx, l) }()
		lb.server = srv
		lb.backend, lb.where = server.NewClient("http://"+l.Addr().String(), log), "server http://"+l.Addr().String()
	}
	if lb.clock != nil {
		lb.nodeOpts = append(lb.nodeOpts, node.WithClock(lb.clock))
	}
	return lb, nil
}

// followLocalRun prints a progress line at each new step until the run has
// passed epochs epochs or finished, ctx ends (an interrupt), or a trainer
// fails. It returns the last state and the rounds' timing.
func followLocalRun(ctx, runCtx context.Context, out io.Writer, b chain.Backend, runID string, epochs int,
	trainers []*localTrainer, errs <-chan error, onStep func(*coordinator.Coordinator)) (*coordinator.Coordinator, *roundClock, error) {
	snaps, err := b.Subscribe(runCtx, runID)
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	var last *coordinator.Coordinator
	lastStep := uint32(0)
	rounds := &roundClock{}
	dropped := map[coordinator.ClientID]bool{}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "interrupted")
			return last, rounds, nil
		case err := <-errs:
			return nil, nil, fmt.Errorf("a trainer stopped: %w", err)
		case s, ok := <-snaps:
			if !ok {
				return last, rounds, nil
			}
			last = s.State
			reportDrops(out, s.State, trainers, dropped)
			if s.State.Progress.Step != lastStep && s.State.RunState == coordinator.RoundTrain {
				lastStep = s.State.Progress.Step
				rounds.start(s.State.Progress.Epoch, trainers)
				printLocalProgress(out, s.State, trainers, time.Since(start))
				onStep(s.State)
			}
			if int(s.State.Progress.Epoch) >= epochs || s.State.RunState == coordinator.Finished {
				return last, rounds, nil
			}
		}
	}
}

// reportDrops prints, once each, the trainers a health check dropped.
func reportDrops(out io.Writer, s *coordinator.Coordinator, trainers []*localTrainer, seen map[coordinator.ClientID]bool) {
	for _, c := range append(s.Epoch.Clients[:s.Epoch.ClientsLen:s.Epoch.ClientsLen], s.Epoch.Exited[:s.Epoch.ExitedLen]...) {
		if c.State != coordinator.Dropped || seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		for i, t := range trainers {
			if t.node.ID() == c.ID {
				fmt.Fprintf(out, "localnet: trainer %d was dropped by a health check (epoch %d, step %d)\n", i, s.Progress.Epoch, s.Progress.Step)
			}
		}
	}
}

// roundClock splits the rounds' wall time into the trainers' compute and the
// rest (coordination and networking), from the start of each round to the
// next one's within an epoch.
type roundClock struct {
	epoch   uint32
	at      time.Time
	compute time.Duration // all trainers' compute so far
	n       int
	wall    time.Duration // measured rounds' total
	busy    time.Duration // their compute, summed over trainers
}

func (r *roundClock) start(epoch uint32, trainers []*localTrainer) {
	now := time.Now()
	var compute time.Duration
	for _, t := range trainers {
		compute += t.progress().Compute
	}
	if !r.at.IsZero() && epoch == r.epoch {
		r.n++
		r.wall += now.Sub(r.at)
		r.busy += compute - r.compute
	}
	r.epoch, r.at, r.compute = epoch, now, compute
}

// report prints the mean round and its split; a trainer's share is its
// compute averaged over the trainers.
func (r *roundClock) report(w io.Writer, trainers int) {
	if r.n == 0 {
		return
	}
	round := r.wall / time.Duration(r.n)
	compute := r.busy / time.Duration(r.n*trainers)
	other := round - compute
	fmt.Fprintf(w, "rounds: %s mean over %d; training compute %s (%.0f%%), coordination + networking %s (%.0f%%)\n",
		round.Round(time.Millisecond), r.n, compute.Round(time.Millisecond), 100*float64(compute)/float64(round),
		other.Round(time.Millisecond), 100*float64(other)/float64(round))
}

// startLocalSolana starts the local validator with the coordinator program
// and funds the given keys (the run's account and every transaction's fee
// come from them).
func startLocalSolana(ctx context.Context, dir string, log *slog.Logger, manualClock bool, fund []*chain.Keypair) (*solana.Backend, *validator.Validator, error) {
	so := filepath.Join(dir, "coordinator.so")
	if err := os.WriteFile(so, program.Program, 0o644); err != nil {
		return nil, nil, err
	}
	vopts := []validator.Option{validator.WithPort(0), validator.WithProgram(solana.LocalProgramID.String(), so), validator.WithLogger(log)}
	if manualClock {
		vopts = append(vopts, validator.WithManualClock())
	}
	v, err := validator.Start(ctx, vopts...)
	if err != nil {
		return nil, nil, fmt.Errorf("starting the local Solana validator: %w", err)
	}
	b, err := solana.New(solana.WithRPC(v.RPC), solana.WithWebsocket(v.WebSocket), solana.WithLogger(log))
	if err != nil {
		v.Close()
		return nil, nil, err
	}
	for _, k := range fund {
		if err := b.Airdrop(ctx, k.Public(), 20_000_000_000); err != nil {
			v.Close()
			return nil, nil, fmt.Errorf("funding %s: %w", k.Public().String(), err)
		}
	}
	return b, v, nil
}

type localTrainer struct {
	node *node.Node
	net  *libp2p.Node
	mu   sync.Mutex
	prog node.Progress
}

func (t *localTrainer) progress() node.Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prog
}

func createLocalRun(ctx context.Context, b chain.Backend, runID string, admin *chain.Keypair, n, perTrainer, epochTime int, m coordinator.Model, files localFiles, tune func(*coordinator.Config, *coordinator.Model)) error {
	id, err := coordinator.ParseRunID(runID)
	if err != nil {
		return err
	}
	batch := uint16(perTrainer * n)
	cfg := coordinator.Config{WarmupTime: 5, CooldownTime: 5, MaxRoundTrainTime: uint64(min(30, epochTime-1)), RoundWitnessTime: 1,
		EpochTime: uint64(epochTime), WaitingForMembersExtraTime: 1, TotalSteps: 100_000,
		GlobalBatchSizeStart: batch, GlobalBatchSizeEnd: batch, InitMinClients: uint16(n), MinClients: uint16(max(1, n-1))}
	tune(&cfg, &m)
	// The trainers draw the model from the seed and check it against its
	// hash, as in a run file with url = "seed:N".
	m.Checkpoint.Kind = coordinator.CheckpointHub
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], runmodel.SeedURL(files.seed))          // at most 25 bytes: fits
	_ = coordinator.SetFixedString(m.Checkpoint.Source.Revision[:], runmodel.Revision(files.initial)) // 32 bytes: fits
	m.DataKind, m.TokenSize = coordinator.DataLocal, uint8(files.tokenSize)
	if err := coordinator.SetFixedString(m.DataLocation[:], files.tokens); err != nil {
		return fmt.Errorf("the working directory's path is too long for a data location: %w", err)
	}
	var meta coordinator.Metadata
	_ = coordinator.SetFixedString(meta.Name[:], "localnet")
	for _, ix := range []coordinator.Instruction{&coordinator.InitCoordinator{MainAuthority: admin.Public(), RunID: id},
		&coordinator.Update{Metadata: &meta, Config: &cfg, Model: &m}, &coordinator.SetPaused{}} {
		if _, err := b.Send(ctx, runID, admin, nil, ix); err != nil {
			return fmt.Errorf("%s: %w", ix.Name(), err)
		}
	}
	return nil
}

// localnetAdversary, set by the adversary build (localnet_adversary.go),
// returns the options that make the last trainer adversarial (none: all
// honest).
var localnetAdversary func(c *cli.Context) ([]node.Option, error)

// watchHeap samples the heap in use every 50 ms until ctx ends; the returned
// function is the largest sample (the process's peak, all trainers together).
func watchHeap(ctx context.Context) func() uint64 {
	var mu sync.Mutex
	var peak uint64
	sample := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		mu.Lock()
		peak = max(peak, ms.HeapAlloc)
		mu.Unlock()
	}
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				sample()
			}
		}
	}()
	return func() uint64 { sample(); mu.Lock(); defer mu.Unlock(); return peak }
}

// startTrainers starts a trainer for each signer, the last with lastOpts
// too, trainer i with engines[i % len(engines)] (none: the go engine);
// ordered ones join each epoch in the signers' order (node.WithJoinOrder).
func startTrainers(ctx context.Context, runID string, signers []*chain.Keypair, b chain.Backend, dir string, log *slog.Logger, ordered bool, lastOpts []node.Option, engines [][]node.Option, opts ...node.Option) ([]*localTrainer, error) {
	var trainers []*localTrainer
	var addrs []string
	var earlier []coordinator.Pubkey
	for i, signer := range signers {
		own := opts
		if ordered {
			own = append(slices.Clone(opts), node.WithJoinOrder(earlier...))
			earlier = append(earlier, signer.Public())
		}
		if len(engines) > 0 {
			own = append(slices.Clone(own), engines[i%len(engines)]...)
		}
		seed := sha256.Sum256([]byte(fmt.Sprintf("localnet p2p %d %s", i, runID)))
		t := &localTrainer{}
		nd, pn, err := start.Trainer(ctx, runID, b, signer, []libp2p.Option{libp2p.WithListenAddrs("/ip4/127.0.0.1/tcp/0"),
			libp2p.WithKey(ed25519.NewKeyFromSeed(seed[:])), libp2p.WithLogger(log.With("trainer", i))},
			append([]node.Option{node.WithPeers(addrs...), node.WithCheckpointDir(dir), node.WithLogger(log.With("trainer", i)),
				node.WithProgress(func(p node.Progress) { t.mu.Lock(); t.prog = p; t.mu.Unlock() })}, trainerOpts(i, len(signers), lastOpts, own)...)...)
		if err != nil {
			return nil, err
		}
		t.node, t.net = nd, pn
		addrs = append(addrs, pn.Addrs()...)
		trainers = append(trainers, t)
	}
	return trainers, nil
}

// reproducibleSeed is a round seed of a virtual-time localnet: a function
// of the run's seed and of the state an instruction applies to, so that the
// same run draws the same seeds whichever instruction starts each round (a
// witness report that completes it, or a tick once its witness time is
// over; both count as its training phase). With the trainers joining in a
// fixed order, the same --seed then trains the same batches on the same
// trainers: the run is repeatable (timing aside: a result that misses its
// round in one run and not in another makes them differ).
func reproducibleSeed(seed uint64, s *coordinator.Coordinator) uint64 {
	phase := s.RunState
	if phase == coordinator.RoundWitness {
		phase = coordinator.RoundTrain
	}
	var b [8 + 8 + 4 + 4 + 1]byte
	copy(b[:], "localnet")
	binary.LittleEndian.PutUint64(b[8:], seed)
	binary.LittleEndian.PutUint32(b[16:], s.Progress.Epoch)
	binary.LittleEndian.PutUint32(b[20:], s.Progress.Step)
	b[24] = byte(phase)
	sum := sha256.Sum256(b[:])
	return binary.LittleEndian.Uint64(sum[:8])
}

// trainerOpts are trainer i's options: opts, and lastOpts for the last.
func trainerOpts(i, n int, lastOpts, opts []node.Option) []node.Option {
	if i == n-1 {
		return append(slices.Clone(opts), lastOpts...)
	}
	return opts
}

func printLocalProgress(w io.Writer, s *coordinator.Coordinator, trainers []*localTrainer, elapsed time.Duration) {
	var loss float32
	var tokens, sent uint64
	count := 0
	for _, t := range trainers {
		p := t.progress()
		if p.Loss > 0 {
			loss += p.Loss
			count++
		}
		tokens += p.Tokens
		sent += p.Sent
	}
	shown := "    -" // no batch trained yet: no loss to show
	if count > 0 {
		shown = fmt.Sprintf("%.3f", loss/float32(count))
	}
	fmt.Fprintf(w, "%6.1fs  epoch %d  step %3d  clients %d  loss %s  tokens %7d (%.0f/s)  sent %s\n",
		elapsed.Seconds(), s.Progress.Epoch, s.Progress.Step, s.Epoch.ClientsLen, shown, tokens,
		float64(tokens)/elapsed.Seconds(), bytesString(sent))
}

func bytesString(b uint64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// heldOutLoss is the mean loss over up to 32 held-out sequences, taken 4 at
// a time: a model keeps activations and their gradients sized for its last
// batch, and with Llama 3's 128,256-token vocabulary 32 sequences' logits
// alone are a gigabyte, twice.
func heldOutLoss(m runmodel.Model, tokens []uint32) (float32, error) {
	const chunk = 4
	cfg, err := runmodel.ConfigOf(m)
	if err != nil {
		return 0, err
	}
	t := cfg.Context()
	seqs := min(32, (len(tokens)-1)/t)
	if seqs < 1 {
		return 0, fmt.Errorf("the held-out tenth of the data has %d tokens, fewer than one sequence of %d needs", len(tokens), t+1)
	}
	in, tg := make([]uint32, chunk*t), make([]uint32, chunk*t)
	var sum float64
	for first := 0; first < seqs; first += chunk {
		n := min(chunk, seqs-first)
		for i := range n {
			at := (first + i) * t
			copy(in[i*t:], tokens[at:at+t])
			copy(tg[i*t:], tokens[at+1:at+t+1])
		}
		loss, err := m.Forward(in[:n*t], tg[:n*t], n, t)
		if err != nil {
			return 0, err
		}
		sum += float64(loss) * float64(n)
	}
	return float32(sum / float64(seqs)), nil
}

func summarize(w io.Writer, s *coordinator.Coordinator, initial runmodel.Model, trainers []*localTrainer, heldOut []uint32, elapsed time.Duration) error {
	if s == nil {
		return fmt.Errorf("no coordinator state was received")
	}
	final := trainers[0].node.Model()
	var tokens, sent, results uint64
	for _, t := range trainers {
		p := t.progress()
		tokens += p.Tokens
		sent += p.Sent
	}
	fmt.Fprintf(w, "\ndone in %s: epoch %d, step %d\n", elapsed.Round(time.Second), s.Progress.Epoch, s.Progress.Step)
	before, err := heldOutLoss(initial, heldOut)
	if err != nil {
		return err
	}
	if final != nil {
		after, err := heldOutLoss(final, heldOut)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "held-out loss: %.3f -> %.3f\n", before, after)
		same := true
		for _, t := range trainers[1:] {
			if m := t.node.Model(); m == nil || m.Hash() != final.Hash() {
				same = false
			}
		}
		// The hash tells runs apart: a --virtual-time run with the same
		// --seed ends at the same one.
		fmt.Fprintf(w, "trainers hold identical weights: %v (the first's hash %s)\n", same, runmodel.Revision(final))
		if final.Hash() == initial.Hash() && tokens > 0 {
			fmt.Fprintf(w, "note: the trainers trained but no round's results were applied: when batches take longer than a round may last (%d s here), "+
				"the rounds end without them; on a slow or busy machine use --virtual-time (timeouts then never race compute) or a smaller --batch\n",
				s.Config.MaxRoundTrainTime)
		}
	}
	if s.Progress.Step > 0 {
		results = uint64(s.Progress.Step-1) * uint64(len(trainers))
	}
	dense := results * 4 * uint64(initial.NumParams())
	fmt.Fprintf(w, "tokens trained: %d\n", tokens)
	var verified uint64
	var verify, compute time.Duration
	for _, t := range trainers {
		p := t.progress()
		verified, verify, compute = verified+p.Verified, verify+p.Verify, compute+p.Compute
	}
	if verified > 0 {
		fmt.Fprintf(w, "verification: %d results scored, %s of the trainers' %s of compute (%.1f%%)\n", verified,
			verify.Round(time.Millisecond), compute.Round(time.Millisecond), 100*verify.Seconds()/compute.Seconds())
	}
	if sent > 0 && dense > 0 {
		fmt.Fprintf(w, "results sent: %s (dense fp32 gradients would be %s: %.0fx more)\n", bytesString(sent), bytesString(dense), float64(dense)/float64(sent))
	}
	url := coordinator.FixedString(s.Model.Checkpoint.Source.URL[:])
	note := ""
	if strings.HasPrefix(url, "seed:") {
		note = ", the run's start: no epoch has ended"
	}
	fmt.Fprintf(w, "checkpoint: %s (%s%s)\n", strings.TrimPrefix(url, "file://"), s.Model.Checkpoint.Kind, note)
	return nil
}

// archName names an architecture as run files do.
func archName(a coordinator.Architecture) string {
	switch a {
	case coordinator.ArchGPT:
		return "GPT"
	case coordinator.ArchLlama:
		return "Llama"
	}
	return fmt.Sprintf("architecture %d", a)
}

// dropLast runs the last trainer until the run reaches step at (0: to the
// end), then stops it as a machine that fails would stop: its node and its
// libp2p host end, and the others' witnesses report it missing. Its result
// goes to errs only once runCtx ends, so the run goes on without it. The
// returned function is called at each new step.
func dropLast(runCtx context.Context, out io.Writer, t *localTrainer, at int, errs chan<- error) func(*coordinator.Coordinator) {
	ctx, stop := context.WithCancel(runCtx)
	go func() {
		err := t.node.Run(ctx)
		if ctx.Err() != nil && runCtx.Err() == nil {
			<-runCtx.Done() // stopped on purpose: not a failure of the run
			err = nil
		}
		errs <- err // as for every other trainer, if it stopped by itself
	}()
	var once sync.Once
	return func(s *coordinator.Coordinator) {
		if at <= 0 || s.Progress.Step < uint32(at) {
			return
		}
		once.Do(func() {
			fmt.Fprintf(out, "localnet: stopping trainer %s at step %d (--drop-trainer-at)\n", t.node.ID().Signer.String(), s.Progress.Step)
			stop()
			_ = t.net.Close()
		})
	}
}

// startLocalExplorer serves the run explorer for the run on addr (none if
// addr is empty) until ctx ends, and prints its address. It measures the
// held-out loss of the initial model and of every checkpoint the run
// records (they are files here) for the loss curve.
func startLocalExplorer(ctx context.Context, addr string, out io.Writer, log *slog.Logger, lb *localBackend, runID string, epochs int, files localFiles) error {
	if addr == "" {
		return nil
	}
	opts := []explorer.Option{explorer.WithLogger(log), explorer.WithRefresh(time.Second), explorer.WithEpochLimit(uint32(epochs))}
	if lb.clock != nil {
		opts = append(opts, explorer.WithClock(lb.clock.Now))
	}
	ex, err := explorer.New(opts...)
	if err != nil {
		return err
	}
	src := explorer.FixedRuns(lb.backend, runID)
	if lb.server != nil {
		src = serverSource(lb.server)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--explorer-addr: %w", err)
	}
	if before, err := heldOutLoss(files.initial, files.heldOut); err == nil {
		ex.RecordHeldOut(runID, 0, 0, float64(before))
	}
	snaps, err := lb.backend.Subscribe(ctx, runID)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "localnet: explorer http://%s/#/run/%s\n", l.Addr(), runID)
	go func() { _ = serveExplorer(ctx, l, ex, src, log) }()
	go measureCheckpoints(snaps, ex, runID, files.heldOut, log)
	return nil
}

// measureCheckpoints records the held-out loss of each checkpoint the run
// records (a file:// URL in a cooldown), at the step it was recorded.
func measureCheckpoints(snaps <-chan chain.Snapshot, ex *explorer.Explorer, runID string, heldOut []uint32, log *slog.Logger) {
	last := ""
	for s := range snaps {
		url := coordinator.FixedString(s.State.Model.Checkpoint.Source.URL[:])
		path, ok := strings.CutPrefix(url, "file://")
		if !s.State.Epoch.Checkpointed || !ok || url == last {
			continue
		}
		last = url
		m, err := runmodel.Load(context.Background(), path, nil)
		if err == nil {
			var loss float32
			if loss, err = heldOutLoss(m, heldOut); err == nil {
				ex.RecordHeldOut(runID, s.State.Progress.Step, s.State.Progress.Epoch, float64(loss))
				continue
			}
		}
		log.Warn("measuring a checkpoint's held-out loss", "checkpoint", url, "err", err)
	}
}
