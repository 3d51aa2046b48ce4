package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/urfave/cli/v2"
)

func defaultKeyPath() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "psyche-key.json"
	}
	return filepath.Join(dir, "psyche", "id.json")
}

var (
	serverFlag    = &cli.StringFlag{Name: "server", Value: "http://127.0.0.1:7600", Usage: "URL of the server backend (when --rpc is not given)", Category: "BACKEND"}
	rpcFlag       = &cli.StringSliceFlag{Name: "rpc", Usage: "Solana JSON-RPC endpoint(s), tried in order: selects the Solana backend", Category: "BACKEND"}
	wsFlag        = &cli.StringSliceFlag{Name: "ws-rpc", Usage: "Solana websocket endpoint(s) (default: each --rpc with ws:// or wss:// and, where it names a port, the port + 1, as Solana validators serve it)", Category: "BACKEND"}
	programIDFlag = &cli.StringFlag{Name: "program-id", Value: solana.LocalProgramID.String(), Usage: "address of the coordinator program", Category: "BACKEND"}
	keyFlag       = &cli.StringFlag{Name: "key", Value: defaultKeyPath(), Usage: "key file (Solana CLI JSON format)", Category: "IDENTITY"}
	runIDFlag     = &cli.StringFlag{Name: "run-id", Required: true, Usage: "the run (1-32 characters of [A-Za-z0-9._-])", Category: "RUN"}
)

var adminCommands = []*cli.Command{
	{
		Name:  "keygen",
		Usage: "create a key file (each trainer and the admin needs its own)",
		Flags: []cli.Flag{&cli.StringFlag{Name: "out", Value: defaultKeyPath(), Usage: "where to write the key", Category: "IDENTITY"},
			&cli.BoolFlag{Name: "force", Usage: "replace an existing key file (the address it held is lost)", Category: "IDENTITY"}},
		Action: keygen,
	},
	{
		Name:  "server",
		Usage: "run the server backend",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Value: filepath.Join(defaultDataDir(), "server"), Usage: "directory holding the runs' state and the p2p host's key", Category: "SERVER"},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:7600", Usage: "address to serve on", Category: "SERVER"},
			&cli.DurationFlag{Name: "tick-interval", Value: time.Second, Usage: "how often every run is ticked", Category: "SERVER"},
			&cli.StringSliceFlag{Name: "creators", Value: cli.NewStringSlice(defaultKeyPath()),
				Usage:    "who may create runs: addresses, key files (their address), or \"any\"; the default is the key psyche keygen writes, so the admin commands work as they stand on this machine",
				Category: "SERVER"},
			&cli.IntFlag{Name: "creator-quota", Value: server.DefaultCreatorQuota, Usage: "live runs each creator may hold", Category: "SERVER"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics (/metrics) and Go profiles (/debug/pprof/) on this address (e.g. 127.0.0.1:9101)", Category: "METRICS"},
			&cli.BoolFlag{Name: "p2p", Value: true, Usage: "run a libp2p host that trainers bootstrap their run's DHT from (its addresses are served at /v1/p2p)", Category: "P2P"},
			&cli.StringSliceFlag{Name: "p2p-listen", Value: cli.NewStringSlice("/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"), Usage: "the p2p host's listen addresses (multiaddrs)", Category: "P2P"},
			&cli.BoolFlag{Name: "relay", Usage: "relay connections between the runs' trainers that cannot reach each other directly (circuit relay v2)", Category: "P2P"},
			dataDirFlag,
			&cli.BoolFlag{Name: "browser-trainer", Value: true, Usage: "serve the browser trainer at /train/<run>; a binary without its WebAssembly module (no go generate) builds it with the go command on PATH from the checkout it was compiled from, once a federated run exists or a visitor asks: false serves and builds nothing (docs/security.md)", Category: "SERVER"},
		},
		Action: runServer,
	},
	{
		Name:  "init-coordinator",
		Usage: "create a run (it starts paused; configure it with update, then set-paused --resume)",
		Flags: []cli.Flag{serverFlag, keyFlag, runIDFlag,
			&cli.StringFlag{Name: "join-authority", Usage: "address that must co-sign every join (default: anyone may join)", Category: "RUN"}},
		Action: initCoordinator,
	},
	{
		Name:  "update",
		Usage: "set a run's metadata, config and model from a TOML file (see examples/)",
		Flags: []cli.Flag{serverFlag, keyFlag, runIDFlag,
			&cli.StringFlag{Name: "config", Required: true, Usage: "run file (TOML)", Category: "RUN"}},
		Action: update,
	},
	{
		Name:   "set-paused",
		Usage:  "pause a run (or resume it with --resume)",
		Flags:  []cli.Flag{serverFlag, keyFlag, runIDFlag, &cli.BoolFlag{Name: "resume", Usage: "resume instead of pausing", Category: "RUN"}},
		Action: setPaused,
	},
	{
		Name:  "free-coordinator",
		Usage: "remove a run that is paused or finished, so that its run id can be created again (the main authority)",
		Flags: []cli.Flag{serverFlag, keyFlag, runIDFlag},
		Action: func(c *cli.Context) error {
			b, k, err := backend(c, true)
			if err != nil {
				return err
			}
			id := c.String("run-id")
			r, err := b.Send(c.Context, id, k, nil, &coordinator.FreeCoordinator{})
			if errors.Is(err, coordinator.ErrNotHalted) {
				return fmt.Errorf("%w: pause it first (psyche set-paused --run-id %s; it pauses when its epoch ends)", err, id)
			}
			if err != nil {
				return err
			}
			// The coordinator reports the state it freed the run in; the
			// run itself is gone.
			fmt.Fprintf(c.App.Writer, "free_coordinator: ok: run %q removed (it was %s); psyche init-coordinator --run-id %s creates it anew\n", id, r.From, id)
			return nil
		},
	},
	{
		Name:  "tick",
		Usage: "advance a run's state machine",
		Flags: []cli.Flag{serverFlag, keyFlag, runIDFlag,
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "time between ticks", Category: "RUN"},
			&cli.IntFlag{Name: "count", Value: 1, Usage: "ticks to send (0: until interrupted)", Category: "RUN"}},
		Action: tick,
	},
	{
		Name:  "status",
		Usage: "show a run: its state (and what a waiting run needs), the round, the checkpoint, and each member once with its latest state",
		Flags: []cli.Flag{serverFlag, runIDFlag, &cli.BoolFlag{Name: "json", Usage: "print JSON", Category: "OUTPUT"},
			&cli.BoolFlag{Name: "history", Usage: "print the run's per-step history as CSV (step, epoch, loss, held-out loss, tokens/s, bytes, witnesses), as the server's explorer keeps it", Category: "OUTPUT"},
			&cli.StringFlag{Name: "explorer", Usage: "with --history: the explorer to ask (default: the --server; for a Solana run, a psyche explorer's URL)", Category: "OUTPUT"}},
		Action: status,
	},
	{
		Name:  "checkpoint",
		Usage: "record where this epoch's model was saved (elected checkpointers and the main authority, in Cooldown)",
		Flags: []cli.Flag{serverFlag, keyFlag, runIDFlag,
			&cli.StringFlag{Name: "url", Required: true, Usage: "where the checkpoint is", Category: "RUN"},
			&cli.StringFlag{Name: "revision", Usage: "revision of the checkpoint", Category: "RUN"}},
		Action: recordCheckpoint,
	},
}

func keygen(c *cli.Context) error {
	path := c.String("out")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	k, err := chain.NewKeypair()
	if err != nil {
		return err
	}
	save := k.Save
	if c.Bool("force") {
		save = k.Replace
	}
	if err := save(c.Context, path); err != nil {
		if errors.Is(err, chain.ErrKeyExists) {
			return fmt.Errorf("%s already holds a key (address %s); write the new one elsewhere with --out FILE, or replace it with --force (its address is then lost)",
				path, addressIn(path))
		}
		return err
	}
	// One key per process: trainers that share a key are one client to
	// the coordinator, and replace each other's p2p identity in it.
	fmt.Fprintf(c.App.Writer, "wrote %s\naddress: %s\n\n"+
		"Each trainer, and the run's admin, needs its own key. Make another with\n"+
		"  psyche keygen --out %s\n"+
		"and pick it with --key, e.g. psyche join --key %[3]s ...\n",
		path, k.Public().String(), nextKeyPath(path))
	return nil
}

// addressIn is the address of the key file at path, for messages ("?" if
// it cannot be read).
func addressIn(path string) string {
	k, err := chain.LoadKeypair(path)
	if err != nil {
		return "?"
	}
	return k.Public().String()
}

// nextKeyPath suggests where another key could go: trainerN.json beside
// path, for the first N with no file.
func nextKeyPath(path string) string {
	for n := 2; ; n++ {
		p := filepath.Join(filepath.Dir(path), fmt.Sprintf("trainer%d.json", n))
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return p
		}
	}
}

// withSolanaFlags gives every command that talks to a backend (it has
// --server) the flags that select Solana instead.
func withSolanaFlags(cmds []*cli.Command) {
	for _, c := range cmds {
		if slices.Contains(c.Flags, cli.Flag(serverFlag)) && !slices.Contains(c.Flags, cli.Flag(rpcFlag)) {
			c.Flags = append(c.Flags, rpcFlag, wsFlag, programIDFlag)
		}
	}
}

// backend returns the backend the flags select and the signing key.
func backend(c *cli.Context, needKey bool) (chain.Backend, *chain.Keypair, error) {
	if err := checkBackendFlags(c); err != nil {
		return nil, nil, err
	}
	var b chain.Backend = serverclient.New(c.String("server"), logger(c))
	if rpcs := c.StringSlice("rpc"); len(rpcs) > 0 {
		wss := c.StringSlice("ws-rpc")
		if len(wss) == 0 {
			for _, u := range rpcs {
				ws, err := solana.WebsocketFor(u)
				if err != nil {
					return nil, nil, fmt.Errorf("--rpc: %w", err)
				}
				wss = append(wss, ws)
			}
		}
		program, err := coordinator.ParsePubkey(c.String("program-id"))
		if err != nil {
			return nil, nil, fmt.Errorf("--program-id: %w", err)
		}
		if b, err = solana.New(solana.WithRPC(rpcs...), solana.WithWebsocket(wss...), solana.WithProgramID(program), solana.WithLogger(logger(c))); err != nil {
			return nil, nil, err
		}
	}
	if !needKey {
		return b, nil, nil
	}
	k, err := chain.LoadKeypair(c.String("key"))
	if err != nil {
		return nil, nil, fmt.Errorf("%w (create one with `psyche keygen`)", err)
	}
	return b, k, nil
}

func send(c *cli.Context, ix coordinator.Instruction) error {
	b, k, err := backend(c, true)
	if err != nil {
		return err
	}
	r, err := b.Send(c.Context, c.String("run-id"), k, nil, ix)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "%s: ok (%s -> %s, nonce %d)\n", ix.Name(), r.From, r.To, r.Nonce)
	return nil
}

func initCoordinator(c *cli.Context) error {
	id, err := coordinator.ParseRunID(c.String("run-id"))
	if err != nil {
		return err
	}
	_, k, err := backend(c, true)
	if err != nil {
		return err
	}
	ix := &coordinator.InitCoordinator{MainAuthority: k.Public(), RunID: id}
	if ja := c.String("join-authority"); ja != "" {
		if ix.JoinAuthority, err = coordinator.ParsePubkey(ja); err != nil {
			return err
		}
	}
	if err := send(c, ix); !errors.Is(err, coordinator.ErrAlreadyInitialized) {
		return err
	}
	return runExists(c)
}

// runExists says what to do about a run id that is taken: a paused or
// finished run is removed with free-coordinator (by its main authority)
// and can then be created anew; a live one must be paused first.
func runExists(c *cli.Context) error {
	id := c.String("run-id")
	state := ""
	halted := true
	if b, _, err := backend(c, false); err == nil {
		if snap, err := b.Snapshot(c.Context, id); err == nil {
			state = fmt.Sprintf(" (%s, epoch %d, step %d)", snap.State.RunState, snap.State.Progress.Epoch, snap.State.Progress.Step)
			halted = snap.State.RunState.Halted()
		}
	}
	if halted {
		return fmt.Errorf("run %q exists already%s: remove it with psyche free-coordinator --run-id %s (its main authority; a paused or finished run), then create it anew, or pick another --run-id",
			id, state, id)
	}
	return fmt.Errorf("run %q exists already%s: pause it (psyche set-paused --run-id %s; it pauses when its epoch ends), remove it with psyche free-coordinator --run-id %[3]s, then create it anew, or pick another --run-id",
		id, state, id)
}

func update(c *cli.Context) error {
	u, err := loadRunFile(c.String("config"))
	if err != nil {
		return err
	}
	fed, err := loadFederated(c.String("config"))
	if err != nil {
		return err
	}
	if w := updateWarning(u, fed); w != "" {
		fmt.Fprintf(c.App.ErrWriter, "warning: %s\n", w)
	}
	if err := send(c, u); err != nil || fed == nil {
		return finishedHint(c, err)
	}
	return configureFederated(c, fed)
}

func setPaused(c *cli.Context) error {
	return finishedHint(c, send(c, &coordinator.SetPaused{Paused: !c.Bool("resume")}))
}

// finishedHint adds to a refusal because the run is finished what can be
// done instead: nothing changes a finished run, but it can be removed and
// created again under the same id.
func finishedHint(c *cli.Context, err error) error {
	if errors.Is(err, coordinator.ErrFinished) {
		id := c.String("run-id")
		return fmt.Errorf("%w; to train again under this id, remove it (psyche free-coordinator --run-id %s) and create it anew (psyche init-coordinator --run-id %[2]s)", err, id)
	}
	return err
}

func recordCheckpoint(c *cli.Context) error {
	var src coordinator.CheckpointSource
	if err := coordinator.SetFixedString(src.URL[:], c.String("url")); err != nil {
		return err
	}
	if err := coordinator.SetFixedString(src.Revision[:], c.String("revision")); err != nil {
		return err
	}
	return send(c, &coordinator.RecordCheckpoint{Source: src})
}

func tick(c *cli.Context) error {
	b, k, err := backend(c, true)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	t := time.NewTicker(c.Duration("interval"))
	defer t.Stop()
	for i := 0; c.Int("count") == 0 || i < c.Int("count"); i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
		r, err := b.Send(ctx, c.String("run-id"), k, nil, &coordinator.Tick{})
		switch {
		case errors.Is(err, coordinator.ErrHalted):
			// Nothing will ever be due until someone else acts: an error,
			// with what to do.
			state := coordinator.Paused
			if snap, serr := b.Snapshot(ctx, c.String("run-id")); serr == nil {
				state = snap.State.RunState
			}
			if state == coordinator.Finished {
				return fmt.Errorf("tick: run %q is finished: it has nothing left to advance", c.String("run-id"))
			}
			return fmt.Errorf("tick: run %q is %s: nothing advances until its authority resumes it (psyche set-paused --resume)", c.String("run-id"), state)
		case errors.Is(err, coordinator.ErrNothingDue):
			// Refused by the coordinator (on chain: in preflight, so no fee
			// was paid); say in which state it waits.
			state := "?"
			if snap, serr := b.Snapshot(ctx, c.String("run-id")); serr == nil {
				state = snap.State.RunState.String()
			}
			fmt.Fprintf(c.App.Writer, "tick: nothing to do (%s)\n", state)
		case err != nil && c.Int("count") == 1:
			return fmt.Errorf("tick: %w", err)
		case err != nil:
			// One of many ticks: say so and go on (a server restarting).
			fmt.Fprintf(c.App.ErrWriter, "tick: %v\n", err)
		case r.Changed:
			fmt.Fprintf(c.App.Writer, "tick: %s -> %s (nonce %d)\n", r.From, r.To, r.Nonce)
		default:
			fmt.Fprintf(c.App.Writer, "tick: nothing to do (%s)\n", r.To)
		}
	}
	return nil
}
