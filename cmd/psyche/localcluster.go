package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/quietclock"
	program "github.com/psyche-go/psyche/programs/coordinator"
	"github.com/psyche-go/psyche/programs/validator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/localrun"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// localFiles are the run's data and initial model (localrun.Files), and
// the data held out of training for the summary's loss.
type localFiles struct {
	localrun.Files
	heldOut []uint32 // the last tenth of the data, never trained on
}

// prepareLocalFiles reads the run's data whole (builtin:opticks as byte
// tokens, or the token file model.data names, its tokens checked against
// the vocabulary), holds its last tenth out and writes the rest to a token
// file in dir for the trainers, and draws the initial model from seed as
// the trainers will, for the summary's before-and-after loss and the run's
// revision.
func prepareLocalFiles(ctx context.Context, dir string, model *coordinator.Model, seed uint64) (localFiles, error) {
	tokenSize := data.TokenSize16
	var tokens []uint32
	if loc := coordinator.FixedString(model.DataLocation[:]); loc == data.BuiltinPrefix+"opticks" {
		tokens = data.Tokenize(data.Opticks())
	} else {
		var err error
		if tokens, err = readRunTokens(ctx, loc, model); err != nil {
			return localFiles{}, err
		}
		tokenSize = int(model.TokenSize)
	}
	cut := len(tokens) * 9 / 10
	files, err := localrun.WriteFiles(ctx, dir, model, tokens[:cut], tokenSize, seed)
	if tf, ok := files.Initial.(*runmodel.Transformers); ok && err == nil {
		// The summary's initial loss and parameter count need the weights,
		// which only transformers draws.
		files.Initial, err = drawTransformers(ctx, tf)
	}
	return localFiles{Files: files, heldOut: tokens[cut:]}, err
}

// nonIID rewrites the trainers' token file in blocks of one trainer's batch
// (perTrainer sequences of seqLen tokens): of every n blocks, the last is
// the text backwards, the others forwards. Trainers read sequences in file
// order (their data are not shuffled), and each round's global batch is n
// consecutive blocks shared out among the n trainers in an order the
// round's seed draws, so each round one trainer trains on backward text;
// the held-out loss stays the forward text's.
func (f *localFiles) nonIID(ctx context.Context, seqLen, perTrainer, n int) error {
	fwd, err := data.ReadTokenFile(ctx, f.Tokens, f.TokenSize)
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
	return data.WriteTokenFile(ctx, f.Tokens, mixed, f.TokenSize)
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
		opts := []localrun.Option{localrun.WithLogger(log), localrun.WithServerOptions(server.WithCreators(creator))}
		if virtual {
			lb.clock = newClock()
			opts = append(opts, localrun.WithClock(lb.clock),
				localrun.WithServerOptions(server.WithStateSeeds(func(s *coordinator.Coordinator) uint64 { return reproducibleSeed(seed, s) })))
		}
		srv, err := localrun.StartServer(runCtx, dir, opts...)
		if err != nil {
			return nil, err
		}
		go func() { lb.up <- srv.Wait() }()
		lb.server = srv.Server
		lb.backend, lb.where = srv.Client, "server "+srv.URL
	}
	if lb.clock != nil {
		lb.nodeOpts = append(lb.nodeOpts, node.WithClock(lb.clock))
	}
	return lb, nil
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

// localTrainer is a started trainer and the progress it reports.
type localTrainer struct {
	*localrun.Trainer
	engine string // what computes for it (--engine)
	mu     sync.Mutex
	prog   node.Progress
}

func (t *localTrainer) progress() node.Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prog
}

// localnetRun is the run localnet creates: n trainers training perTrainer
// sequences each a round of model, epochs of epochTime seconds, for as many
// steps as anyone waits, on files; tune makes the flags' changes.
func localnetRun(runID string, n, perTrainer, epochTime int, model coordinator.Model, files localFiles, tune func(*coordinator.Config, *coordinator.Model)) (localrun.Run, error) {
	r := localrun.NewRun(runID, n, perTrainer, func(k *coordinator.Config, m *coordinator.Model) {
		k.CooldownTime, k.MaxRoundTrainTime, k.EpochTime, k.TotalSteps = 5, uint64(min(30, epochTime-1)), uint64(epochTime), 100_000
		*m = model
	}, tune)
	r.Name = "localnet"
	if err := r.UseFiles(files.Files); err != nil {
		return r, fmt.Errorf("the working directory's path is too long for a data location: %w", err)
	}
	return r, nil
}

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

// startTrainers starts n trainers with keys, the last with lastOpts too,
// trainer i with engines[i % len(engines)] (none: the go engine); ordered
// ones join each epoch in the order they were started (node.WithJoinOrder).
func startTrainers(ctx context.Context, runID string, keys localrun.Keys, n int, b chain.Backend, dir string, log *slog.Logger, ordered bool, lastOpts []node.Option, engines [][]node.Option, opts ...node.Option) ([]*localTrainer, error) {
	trainers := make([]*localTrainer, n)
	for i := range trainers {
		trainers[i] = &localTrainer{}
	}
	ropts := []localrun.Option{localrun.WithLogger(log), localrun.WithCheckpointDir(dir), localrun.WithNodeOptions(opts...),
		localrun.WithTrainerOptions(func(i int) []node.Option {
			t := trainers[i]
			own := []node.Option{node.WithProgress(func(p node.Progress) { t.mu.Lock(); t.prog = p; t.mu.Unlock() })}
			if len(engines) > 0 {
				own = append(own, engines[i%len(engines)]...)
			}
			if i == n-1 {
				own = append(own, lastOpts...)
			}
			return own
		})}
	if ordered {
		ropts = append(ropts, localrun.WithJoinOrder())
	}
	started, err := localrun.NewTrainers(runID, b, keys, ropts...).Start(ctx, n)
	if err != nil {
		return nil, err
	}
	for i, t := range started {
		trainers[i].Trainer = t
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
