package main

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/quietclock"
	"github.com/psyche-go/psyche/p2p/libp2p"
	program "github.com/psyche-go/psyche/programs/coordinator"
	"github.com/psyche-go/psyche/programs/validator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/start"
)

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
	cfg, err := modelspec.ModelConfig(model)
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
		lb.backend, lb.where = serverclient.New("http://"+l.Addr().String(), log), "server http://"+l.Addr().String()
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
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], modelspec.SeedURL(files.seed))         // at most 25 bytes: fits
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
