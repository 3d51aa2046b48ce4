package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/explorer"
	"github.com/psyche-go/psyche/internal/filelock"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/psyche-go/psyche/trainer/start"
	"github.com/psyche-go/psyche/trainer/store"
	"github.com/urfave/cli/v2"
)

var joinCommand = &cli.Command{
	Name:  "join",
	Usage: "train in a run: join every epoch, train, exchange results, witness, checkpoint",
	Flags: []cli.Flag{serverFlag, keyFlag, runIDFlag,
		&cli.StringFlag{Name: "p2p-key", Usage: "p2p identity key file, created if missing (default: beside --key, e.g. id.json -> id.p2p.key)", Category: "P2P"},
		&cli.StringSliceFlag{Name: "listen", Value: cli.NewStringSlice("/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"), Usage: "p2p listen addresses (multiaddrs)", Category: "P2P"},
		&cli.StringSliceFlag{Name: "peer", Usage: "address of another trainer (multiaddr ending in /p2p/<id>), an optional hint: trainers find each other through the run's DHT; repeatable", Category: "P2P"},
		&cli.StringSliceFlag{Name: "bootstrap", Usage: "a host to bootstrap the run's DHT from (multiaddr ending in /p2p/<id>: a psyche relay, or another trainer); repeatable. The server backend's own host is added by itself", Category: "P2P"},
		&cli.StringSliceFlag{Name: "relay", Usage: "a circuit relay to stay reachable through (multiaddr ending in /p2p/<id>, e.g. a psyche relay); repeatable. A server started with --relay is added by itself", Category: "P2P"},
		&cli.BoolFlag{Name: "mdns", Value: true, Usage: "find the run's other trainers on the local network with mDNS", Category: "P2P"},
		&cli.StringFlag{Name: "data-dir", Value: defaultDataDir(), Usage: "where the trainer keeps its files: checkpoints go in <data-dir>/<run-id>/<address, first 8 characters>/checkpoints", Category: "RUN"},
		&cli.StringFlag{Name: "checkpoint-dir", Usage: "where to save checkpoints when elected (default: under --data-dir)", Category: "RUN"},
		&cli.IntFlag{Name: "epochs", Usage: "leave after training this many epochs (0: until the run finishes)", Category: "RUN"},
		&cli.StringFlag{Name: "store-endpoint", Usage: "the checkpoint store endpoint this trainer's store credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, …) are for, as the run file writes it: http(s)://host[:port], or " + store.AWSEndpoint + " for AWS S3. They are sent there only; a run's store at another endpoint is used anonymously, and refused on this machine or its local networks", Category: "STORE"},
		&cli.BoolFlag{Name: "store-allow-http", Usage: "allow plain http to a checkpoint store that is not on this machine's loopback (to --store-endpoint, credentials cross the network in the clear)", Category: "STORE"},
		precisionFlag, engineFlag, deviceFlag, devicesFlag, pythonFlag, compileFlag, placementFlag, deviceMemoryFlag,
		&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics (/metrics) and Go profiles (/debug/pprof/) on this address (e.g. 127.0.0.1:9100)", Category: "METRICS"},
		&cli.StringFlag{Name: "local-data", Usage: "join a federated run (its run file has a [federated] section) as a client that trains on this text file of its own, which never leaves the machine", Category: "FEDERATED"},
		&cli.IntFlag{Name: "rounds", Usage: "with --local-data: leave once the server's model reaches this round (0: when the run finishes)", Category: "FEDERATED"},
		&cli.IntFlag{Name: "batch", Value: 4, Usage: "with --local-data: sequences per local training step", Category: "FEDERATED"},
		&cli.StringFlag{Name: "join-token", Usage: "with --local-data, for a run with a join authority: the authority's token for this key (psyche federated-token)", Category: "FEDERATED"},
		&cli.BoolFlag{Name: "tick", Usage: "send tick transactions when the run's timers say a transition is due (default: on with --rpc, where no server ticks the run)", Category: "RUN"},
	},
	Action: join,
}

func join(c *cli.Context) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	storeAccess := store.Access{Endpoint: c.String("store-endpoint"), AllowHTTP: c.Bool("store-allow-http")}
	if err := storeAccess.Check(); err != nil {
		return err
	}
	prec, err := precision(c)
	if err != nil {
		return err
	}
	kinds, err := engineKinds(c, false)
	if err != nil {
		return err
	}
	b, signer, err := backend(c, true)
	if err != nil {
		return err
	}
	if c.String("local-data") != "" {
		return joinFederated(c, signer)
	}
	// Before any networking: python and torch are there when asked for.
	if err := checkEngines(ctx, c, kinds, prec); err != nil {
		return err
	}
	p2pKey := c.String("p2p-key")
	if p2pKey == "" {
		p2pKey = p2pKeyPath(c.String("key"))
	}
	// Two trainers on one key would be one client to the coordinator (each
	// join replaces the other's p2p identity) or one peer to the others:
	// each holds its keys for as long as it runs.
	for _, k := range []struct{ what, path string }{{"key", c.String("key")}, {"p2p key", p2pKey}} {
		l, err := lockKey(k.what, k.path)
		if err != nil {
			return err
		}
		defer l.Unlock()
	}
	// On a terminal the progress is one live line, and log lines are
	// written above it.
	interactive := isTerminal(c.App.Writer)
	status := &statusLine{term: c.App.Writer}
	log := logger(c)
	if interactive {
		// Every round logs a few INFO lines; on a terminal they would bury
		// the progress line, which says what they say. So there, unless
		// --log-level asks otherwise, only warnings and errors print.
		level := c.String("log-level")
		if !c.IsSet("log-level") {
			level = "warn"
			fmt.Fprintln(c.App.Writer, "logging warnings and errors above the progress line (--log-level info for every round)")
		}
		log = loggerAt(c, status.LogWriter(c.App.ErrWriter), level)
	}
	key, err := libp2p.LoadOrCreateKey(p2pKey)
	if err != nil {
		return err
	}
	var p2pPub coordinator.Pubkey
	copy(p2pPub[:], key.Public().(ed25519.PublicKey))
	if err := keyInUse(ctx, b, c.String("run-id"), signer.Public(), p2pPub, log); err != nil {
		return err
	}
	reg := newRegistry()
	ckptDir, err := checkpointDir(c.String("checkpoint-dir"), c.String("data-dir"), c.String("run-id"), signer.Public().String())
	if err != nil {
		return err
	}
	var last time.Time
	if addr := c.String("metrics-addr"); addr != "" {
		at, err := serveMetrics(ctx, addr, reg)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "metrics: http://%s/metrics\n", at)
	}
	opts := []node.Option{node.WithPeers(c.StringSlice("peer")...),
		node.WithCheckpointDir(ckptDir), node.WithLogger(log), node.WithEpochs(c.Int("epochs")),
		node.WithMetrics(node.NewMetrics(reg)), node.WithStoreAccess(storeAccess)}
	opts = append(opts, node.WithPrecision(prec))
	if kinds[0] == "go" {
		be, got := kernels.WithPrecision(kernels.Default(), prec)
		note := ""
		if got != prec {
			note = fmt.Sprintf(" (%s asked: this backend computes in %s)", prec, got)
		}
		fmt.Fprintf(c.App.Writer, "kernels: %s%s\n", kernels.Describe(be), note)
	}
	eo, err := engineOption(c, kinds[0], prec, log)
	if err != nil {
		return err
	}
	opts = append(opts, eo...)
	if tick := c.Bool("tick"); tick || (!c.IsSet("tick") && len(c.StringSlice("rpc")) > 0) {
		opts = append(opts, node.WithTicking())
	}
	p2pOpts := []libp2p.Option{libp2p.WithListenAddrs(c.StringSlice("listen")...),
		libp2p.WithKey(key), libp2p.WithLogger(log), libp2p.WithMetrics(libp2p.NewMetrics(reg))}
	p2pOpts = append(p2pOpts, bootstrapOptions(ctx, c, b, log)...)
	if joinAdversary != nil {
		bad, leave, err := joinAdversary(ctx, c)
		if err != nil {
			return err
		}
		defer leave()
		opts = append(opts, bad...)
	}
	var pn *libp2p.Node
	var rate stepRate
	var seen node.Progress // the last progress, for the line join ends with
	var seenMu sync.Mutex
	// The trainer's last weights are its checkpoints' and its peers'
	// business: Run need not copy them out of the engine as it ends.
	nd, pn, err := start.Trainer(ctx, c.String("run-id"), b, signer, p2pOpts, append(opts, node.WithoutFinalModel(),
		node.WithProgress(func(p node.Progress) {
			seenMu.Lock()
			seen = p
			seenMu.Unlock()
			if !interactive {
				return
			}
			// Every state change is drawn (the line must never say Cooldown
			// in a new epoch's rounds); steps within a state at most 5 a second.
			now, prev := time.Now(), rate.state
			eta := rate.eta(now, p.State, p.Step, p.TotalSteps)
			if now.Sub(last) < 200*time.Millisecond && p.State == prev {
				return
			}
			last = now
			status.Set(joinStatus(p, len(pn.Peers()), eta))
		}))...)
	if err != nil {
		return err
	}
	defer pn.Close()
	for _, a := range pn.Addrs() {
		fmt.Fprintf(c.App.Writer, "p2p address: %s\n", a)
	}
	if !interactive {
		pctx, stopProgress := context.WithCancel(ctx)
		defer stopProgress()
		go logProgress(pctx, log, wallTicker, func() (node.Progress, int) {
			seenMu.Lock()
			defer seenMu.Unlock()
			return seen, len(pn.Peers())
		})
	}
	err = nd.Run(ctx)
	status.Done()
	if err == nil && ctx.Err() == nil {
		seenMu.Lock()
		fmt.Fprintln(c.App.Writer, leftLine(c.String("run-id"), seen, c.Int("epochs")))
		seenMu.Unlock()
	}
	return err
}

// joinAdversary, set by the adversary build (join_adversary.go), returns
// the options that make this trainer adversarial (none: honest) and what to
// do when it leaves (print its peak heap, for scripts/bench-adversary).
var joinAdversary func(ctx context.Context, c *cli.Context) ([]node.Option, func(), error)

// bootstrapOptions says where the trainer starts on the p2p network: the
// --bootstrap and --relay flags, the backend's own host (the server's), and
// mDNS. A backend without one is no error: the flags and mDNS may suffice.
func bootstrapOptions(ctx context.Context, c *cli.Context, b chain.Backend, log *slog.Logger) []libp2p.Option {
	boot, relays := c.StringSlice("bootstrap"), c.StringSlice("relay")
	if bs, ok := b.(chain.Bootstrapper); ok {
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := bs.P2PBootstrap(bctx)
		cancel()
		switch {
		case err == nil:
			boot, relays = append(boot, info.Addrs...), append(relays, info.Relays...)
			log.Info("bootstrapping from the backend's p2p host", "addrs", len(info.Addrs), "relay", len(info.Relays) > 0)
		case errors.Is(err, chain.ErrNoP2P):
			log.Info("the backend runs no p2p host; finding peers through --bootstrap, --relay, --peer and mDNS")
		default:
			log.Warn("could not ask the backend for its p2p host; finding peers through --bootstrap, --relay, --peer and mDNS", "err", err)
		}
	}
	opts := []libp2p.Option{libp2p.WithBootstrapPeers(boot...), libp2p.WithRelays(relays...)}
	if c.Bool("mdns") {
		opts = append(opts, libp2p.WithMDNS())
	}
	return opts
}

// defaultDataDir is where trainers keep their files unless --data-dir says
// otherwise: $XDG_DATA_HOME/psyche, or ~/.local/share/psyche (empty if there
// is no home directory: join then asks for --data-dir rather than writing
// into the current directory).
func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "psyche")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".local", "share", "psyche")
}

// p2pKeyPath is where the p2p identity of the trainer with the key file
// keyPath lives by default: beside it, with .p2p.key for .json, so that each
// key file has its own p2p identity.
func p2pKeyPath(keyPath string) string {
	return strings.TrimSuffix(keyPath, ".json") + ".p2p.key"
}

// checkpointDir returns (and creates) where the trainer saves checkpoints:
// override if set, else one directory per run and signer under dataDir, so
// that two trainers on one machine never write the same file.
func checkpointDir(override, dataDir, runID, signer string) (string, error) {
	dir := override
	if dir == "" {
		if dataDir == "" {
			return "", errors.New("no data directory: set --data-dir (or HOME or XDG_DATA_HOME)")
		}
		// Run ids may be "." or "..", which name no directory of their own.
		if !filepath.IsLocal(runID) {
			return "", fmt.Errorf("run id %q cannot be a directory name under --data-dir; set --checkpoint-dir", runID)
		}
		// The address is cut to 8 characters (still unique among one
		// machine's trainers): the recorded checkpoint URL, which holds the
		// path, has 128 bytes.
		dir = filepath.Join(dataDir, runID, signer[:min(8, len(signer))], "checkpoints")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("checkpoint directory: %w", err)
	}
	return dir, nil
}

// lockKey holds the lock on the key file at path (what names it in
// errors) for as long as the process runs, refusing if another process
// holds it.
func lockKey(what, path string) (*filelock.Lock, error) {
	l, err := filelock.TryLock(path + ".lock")
	if errors.Is(err, filelock.ErrLocked) {
		return nil, fmt.Errorf("another trainer is using the %s %s: %w; each trainer needs its own --key (make one with psyche keygen --out FILE)", what, path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return l, nil
}

// joinStatus is the live progress line; the loss appears once a batch has
// been trained (before that there is none to show), the run's total steps
// once the node has seen its config, and eta once the steps' rate is known.
func joinStatus(p node.Progress, peers int, eta time.Duration) string {
	loss := "-"
	if p.Tokens > 0 {
		loss = fmt.Sprintf("%.3f", p.Loss)
	}
	step := fmt.Sprint(p.Step)
	if p.TotalSteps > 0 {
		step = fmt.Sprintf("%d/%d", p.Step, p.TotalSteps)
	}
	left := ""
	if eta > 0 {
		left = " eta " + eta.Round(time.Second).String()
	}
	return fmt.Sprintf("%-17s epoch %d step %s%s loss %s tokens %d peers %d sent %s received %s",
		p.State, p.Epoch, step, left, loss, p.Tokens, peers, bytesString(p.Sent), bytesString(p.Received))
}

// progressEvery is how often a trainer whose output is no terminal logs
// its progress.
const progressEvery = 30 * time.Second

// ticker starts a channel that receives the time every period, and returns
// it with the function that stops it: the wall clock's (wallTicker), or a
// test's clock's.
type ticker func(period time.Duration) (<-chan time.Time, func())

func wallTicker(period time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(period)
	return t.C, t.Stop
}

// logProgress logs the trainer's progress (what the live line shows on a
// terminal: progress() is the last reported and the peers) every
// progressEvery of newTicker's clock until ctx ends. Where the output is
// no terminal (a file, a journal) a trainer otherwise logs one INFO line
// an epoch, and a reader could not tell a trainer that waits (for members,
// for its epoch's end) from one that hangs.
func logProgress(ctx context.Context, log *slog.Logger, newTicker ticker, progress func() (node.Progress, int)) {
	ticks, stop := newTicker(progressEvery)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			p, peers := progress()
			step := fmt.Sprint(p.Step)
			if p.TotalSteps > 0 {
				step = fmt.Sprintf("%d/%d", p.Step, p.TotalSteps)
			}
			attrs := []any{"state", p.State.String(), "epoch", p.Epoch, "step", step}
			if p.Tokens > 0 {
				attrs = append(attrs, "loss", fmt.Sprintf("%.3f", p.Loss))
			}
			log.Info("progress", append(attrs, "tokens", p.Tokens, "peers", peers, "sent_bytes", p.Sent, "received_bytes", p.Received)...)
		}
	}
}

// stepRate estimates the time to a run's last step from the time spent in
// rounds (RoundTrain, RoundWitness) per step since it started watching (or
// since the step went back: a restart). Warmups and cooldowns advance no
// step: counted in, every one inflated the estimate (a cooldown showed
// hours where minutes were left), so they are left out, and no estimate is
// shown outside rounds.
type stepRate struct {
	at    time.Time // the last observation
	state coordinator.RunState
	step  uint32
	busy  time.Duration // time in rounds
	steps uint32        // steps taken in it
}

// rounds says whether the run's steps advance in state s.
func rounds(s coordinator.RunState) bool {
	return s == coordinator.RoundTrain || s == coordinator.RoundWitness
}

// eta is the time left at the rounds' rate; 0 outside rounds, until steps
// have advanced in them, or when the total is unknown or reached.
func (r *stepRate) eta(now time.Time, state coordinator.RunState, step, total uint32) time.Duration {
	switch {
	case r.at.IsZero() || step < r.step:
		r.busy, r.steps = 0, 0
	case rounds(r.state):
		r.busy += now.Sub(r.at)
		r.steps += step - r.step
	}
	r.at, r.state, r.step = now, state, step
	if !rounds(state) || total <= step || r.steps == 0 {
		return 0
	}
	return r.busy / time.Duration(r.steps) * time.Duration(total-step)
}

// leftLine is what join prints last, below the progress line, when the
// node leaves on its own: that the run is finished, where and at what
// loss, or that it trained the epochs --epochs asked for.
func leftLine(run string, p node.Progress, epochs int) string {
	if p.State == coordinator.Finished {
		loss := ""
		if p.Tokens > 0 {
			loss = fmt.Sprintf(", last loss %.3f", p.Loss)
		}
		return fmt.Sprintf("the run %s is finished: step %d/%d%s (this trainer trained %d tokens); psyche status --run-id %s shows it",
			run, p.Step, p.TotalSteps, loss, p.Tokens, run)
	}
	return fmt.Sprintf("left the run %s after the %d epochs --epochs asked for (it goes on: epoch %d, step %d)", run, epochs, p.Epoch, p.Step)
}

// isTerminal reports whether w is a character device (a terminal), where a
// live progress line makes sense; elsewhere the logs say what happens.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// keyInUse checks the backend (it answers, and holds the run) and refuses
// a key that the run's current epoch holds under another p2p identity: another trainer is using it (each join would replace the
// other's identity, and this one would wait for a model no peer offers it).
// A pending join under another identity is only warned about: it may be a
// trainer of this key that crashed.
func keyInUse(ctx context.Context, b chain.Backend, runID string, signer, p2p coordinator.Pubkey, log *slog.Logger) error {
	snap, err := b.Snapshot(ctx, runID)
	if errors.Is(err, chain.ErrRunNotFound) {
		// Said before any networking starts (it came after the p2p
		// host's warnings about unreachable bootstrap peers).
		return fmt.Errorf("--run-id %s: no such run at this backend: check the id (psyche status --run-id ID), or create the run with psyche init-coordinator", runID)
	}
	if err != nil {
		// Said before any networking starts: a wrong --server was reported
		// only after the p2p host had started (its warnings and addresses
		// first), by the node's first subscription.
		return err
	}
	s := snap.State
	for _, cl := range s.Epoch.Clients[:s.Epoch.ClientsLen] {
		if cl.ID.Signer == signer && cl.ID.P2P != p2p && s.RunState != coordinator.WaitingForMembers {
			return fmt.Errorf("the key %s is a client of run %q's current epoch under another p2p identity (%s): another trainer is using this key (each needs its own: psyche keygen --out FILE), or an earlier trainer of yours with another p2p key; if it is gone, this one can join when the epoch ends",
				signer, runID, explorer.PeerID(cl.ID.P2P))
		}
	}
	if i, ok := s.PendingIndex(signer); ok && s.Pending[i].P2P != p2p {
		log.Warn("this key has joined the run's next epoch under another p2p identity: if another trainer uses the key, the two will replace each other's join (each trainer needs its own key)",
			"other_p2p", explorer.PeerID(s.Pending[i].P2P))
	}
	return localData(coordinator.FixedString(s.Model.DataLocation[:]))
}

// localData checks, before the trainer joins, that a run whose data is a
// file on each trainer's machine finds it on this one (it failed only after
// joining, without naming model.data).
func localData(loc string) error {
	path := loc
	if p, ok := strings.CutPrefix(loc, "file://"); ok {
		path = p
	} else if loc == "" || strings.HasPrefix(loc, data.BuiltinPrefix) || strings.HasPrefix(loc, data.ServerPrefix) || strings.Contains(loc, "://") {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		wd, _ := os.Getwd()
		return fmt.Errorf("the run's model.data is %q, which this trainer cannot read: %w (each trainer reads it on its own machine; a relative path is read from the trainer's working directory, %s)",
			loc, err, wd)
	}
	return nil
}

// precisionFlag chooses the arithmetic of a trainer's matrix products.
var precisionFlag = &cli.StringFlag{Name: "precision", Value: "fp32", Category: "RUN",
	Usage: "matrix products: fp32, or bf16 (inputs rounded to bfloat16, sums in float32: the GPU's tensor cores; a CPU build computes fp32 and says so)"}

func precision(c *cli.Context) (kernels.Precision, error) {
	p, err := kernels.ParsePrecision(c.String("precision"))
	if err != nil {
		return "", fmt.Errorf("--precision: %w", err)
	}
	return p, nil
}
