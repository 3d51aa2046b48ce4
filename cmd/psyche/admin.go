package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/solana"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/explorer"
	"github.com/psyche-go/psyche/p2p/libp2p"
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
		Usage: "show a run",
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

func runServer(c *cli.Context) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg := newRegistry()
	opts := []server.Option{server.WithLogger(logger(c)), server.WithTickInterval(c.Duration("tick-interval")),
		server.WithMetrics(server.NewMetrics(reg)), server.WithCreatorQuota(c.Int("creator-quota"))}
	creators, err := creatorsOption(c)
	if err != nil {
		return err
	}
	opts = append(opts, creators)
	if dir := c.String(dataDirFlag.Name); dir != "" {
		opts = append(opts, server.WithData(dir))
	}
	// The address first: a server that cannot bind it stops before it
	// writes anything (its identity and p2p key were left behind).
	l, err := listen(c.String("listen"))
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	served := false
	defer func() {
		if !served {
			l.Close()
		}
	}()
	if c.Bool("p2p") {
		if err := os.MkdirAll(c.String("dir"), 0o755); err != nil {
			return err
		}
		// The host's identity is what trainers are told to dial: it lives
		// with the runs' state so that it survives restarts.
		bopts := []libp2p.Option{libp2p.WithKeyFile(filepath.Join(c.String("dir"), "p2p.key")),
			libp2p.WithListenAddrs(c.StringSlice("p2p-listen")...), libp2p.WithLogger(logger(c))}
		if c.Bool("relay") {
			bopts = append(bopts, libp2p.WithRelayService())
		}
		host, err := libp2p.NewBootstrap(bopts...)
		if err != nil {
			return err
		}
		go func() { _ = host.Run(ctx) }()
		defer host.Close()
		for _, a := range host.Addrs() {
			fmt.Fprintf(c.App.Writer, "p2p address: %s\n", a)
		}
		opts = append(opts, server.WithP2P(host))
	} else if c.Bool("relay") {
		return errors.New("--relay needs the p2p host (--p2p)")
	}
	// The run explorer's page is served at "/" beside the API.
	// Each run's per-step history is kept with the runs' state, so the page
	// (and psyche status --history) still has it after a restart.
	ex, err := explorer.New(explorer.WithLogger(logger(c)), explorer.WithRefresh(time.Second),
		explorer.WithHistoryDir(filepath.Join(c.String("dir"), "history")))
	if err != nil {
		return err
	}
	opts = append(opts, server.WithPage(ex.Handler()))
	var s *server.Server
	fed, err := mountFederated(ctx, c.String("dir"), logger(c), reg, &s)
	if err != nil {
		return err
	}
	s, err = server.New(c.String("dir"), append(opts, fed...)...)
	if err != nil {
		return err
	}
	go func() { _ = ex.Run(ctx, serverSource(s)) }()
	if addr := c.String("metrics-addr"); addr != "" {
		at, err := serveMetrics(ctx, addr, reg)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "metrics: http://%s/metrics\n", at)
	}
	fmt.Fprintf(c.App.Writer, "server listening on http://%s (state in %s)\nexplorer: http://%[1]s/\n", l.Addr(), c.String("dir"))
	printDataServed(c.App.Writer, s.DataDir(), l.Addr().String())
	served = true
	return s.Serve(ctx, l)
}

// creatorsOption reads --creators and --creator-quota.
func creatorsOption(c *cli.Context) (server.Option, error) {
	return parseCreators(c.StringSlice("creators"), c.IsSet("creators"), c.Int("creator-quota"), c.App.Writer)
}

// parseCreators turns --creators values ("any", addresses, key files) into
// the server's option, and says on w who may create runs. The default key
// file (explicit false) may be missing, as when the operator has not run
// psyche keygen yet: then nobody may create runs until the server restarts
// with one, and w says so; a file named explicitly must exist.
func parseCreators(values []string, explicit bool, quota int, w io.Writer) (server.Option, error) {
	var keys []coordinator.Pubkey
	var names []string
	for _, v := range values {
		if v == "any" {
			fmt.Fprintf(w, "run creators: any key (at most %d live runs each)\n", quota)
			return server.WithAnyCreator(), nil
		}
		if k, err := coordinator.ParsePubkey(v); err == nil {
			keys, names = append(keys, k), append(names, v)
			continue
		}
		kp, err := chain.LoadKeypair(v)
		if err != nil {
			if !explicit && errors.Is(err, fs.ErrNotExist) {
				fmt.Fprintf(w, "run creators: nobody (no key at %s: run `psyche keygen`, then restart the server, or pass --creators ADDRESS|FILE|any)\n", v)
				continue
			}
			return nil, fmt.Errorf("--creators %s: neither an address nor a key file: %w", v, err)
		}
		keys, names = append(keys, kp.Public()), append(names, kp.Public().String()+" ("+v+")")
	}
	if len(keys) > 0 {
		fmt.Fprintf(w, "run creators: %s (at most %d live runs each)\n", strings.Join(names, ", "), quota)
	}
	return server.WithCreators(keys...), nil
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
	var b chain.Backend = server.NewClient(c.String("server"), logger(c))
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
	return send(c, ix)
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
	if u.Config != nil {
		if w := witnessWarning(u.Config); w != "" {
			fmt.Fprintf(c.App.ErrWriter, "warning: %s\n", w)
		}
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

// statusView is what `psyche status --json` prints.
type statusView struct {
	RunID        string       `json:"run_id"`
	State        string       `json:"state"`
	StateSince   uint64       `json:"state_since"`
	Epoch        uint32       `json:"epoch"`
	Step         uint32       `json:"step"`
	Nonce        uint64       `json:"nonce"`
	PendingPause bool         `json:"pending_pause"`
	Clients      []clientView `json:"clients"`
	Pending      []string     `json:"pending"`
	Exited       []clientView `json:"exited"`
	Round        *roundView   `json:"round,omitempty"`
	// Unattended, in a round nobody has reported in for a while: that no
	// trainer may be left to drop the listed ones (they drop each other).
	Unattended string `json:"unattended,omitempty"`
	Checkpoint struct {
		Kind     string `json:"kind"`
		URL      string `json:"url"`
		Revision string `json:"revision"`
		Store    string `json:"store,omitempty"`    // s3://bucket/prefix elected trainers upload to
		Endpoint string `json:"endpoint,omitempty"` // the store's service (empty: AWS S3)
	} `json:"checkpoint"`
	Data *dataView `json:"data,omitempty"` // where the training tokens come from (datasource.go)
}

type clientView struct {
	Address string `json:"address"`
	P2P     string `json:"p2p"`
	State   string `json:"state"` // clientLabel
	Height  uint32 `json:"exited_height,omitempty"`
	// LastSeen, for a member of the epoch in its rounds: the latest of the
	// rounds the coordinator keeps in which it sent a witness report or a
	// witness had its result (nil: in none of them).
	LastSeen  *uint32 `json:"last_seen_round,omitempty"`
	seenKnown bool    // LastSeen applies (the member is in a round's epoch)
}

// What `psyche status` calls a client besides the coordinator's removals
// (Dropped, Withdrawn, Ejected).
const (
	labelHealthy = "Healthy" // a member of the epoch in progress, in good standing
	labelPending = "Pending" // joined the next epoch, which has not started
	labelLeft    = "Left"    // stayed to the end of its epoch and is not in the run now
)

// clientLabel is what status shows for an entry of the epoch's Clients or
// Exited list. The coordinator keeps Healthy on the entries of an epoch that
// ended (they are its members until the next one starts, and are then copied
// to Exited), so Healthy there does not mean the client is still training:
// the label says where the client is now instead. An entry the coordinator
// removed keeps its removal, with the round in the record.
func clientLabel(s *coordinator.Coordinator, cl coordinator.Client) string {
	if cl.State != coordinator.Healthy {
		return cl.State.String()
	}
	if epochInProgress(s.RunState) {
		if i, ok := s.ClientIndex(cl.ID.Signer); ok {
			if m := s.Epoch.Clients[i]; m.State != coordinator.Healthy {
				return m.State.String()
			}
			return labelHealthy
		}
	}
	if _, ok := s.PendingIndex(cl.ID.Signer); ok {
		return labelPending
	}
	return labelLeft
}

// epochInProgress reports whether the run is in an epoch, whose Clients
// list is then its members (between epochs it is the last epoch's).
func epochInProgress(st coordinator.RunState) bool {
	switch st {
	case coordinator.Warmup, coordinator.RoundTrain, coordinator.RoundWitness, coordinator.Cooldown:
		return true
	}
	return false
}

type roundView struct {
	Height    uint32 `json:"height"`
	DataIndex uint64 `json:"data_index"`
	BatchSize uint16 `json:"batch_size"`
	Witnesses int    `json:"witnesses"`
	Of        uint16 `json:"witness_slots"`
}

// lastSeen is the latest round of the epoch's ring (its last
// coordinator.NumRounds rounds) in which member i was seen: it sent a
// witness report, or a witness had its result. ok false: in none of them.
func lastSeen(s *coordinator.Coordinator, i int) (height uint32, ok bool) {
	cur := s.CurrentRound()
	member := coordinator.ParticipantMember(s.Epoch.Clients[i].ID.Signer)
	for k := range s.Epoch.Rounds {
		r := &s.Epoch.Rounds[k]
		// A slot holding a later height is the last epoch's round.
		if r.Height > cur.Height || cur.Height-r.Height >= coordinator.NumRounds {
			continue
		}
		for _, w := range r.Witnesses[:r.WitnessesLen] {
			if (int(w.Proof.Index) == i || w.Participants.Has(w.Key, member)) && (!ok || r.Height > height) {
				height, ok = r.Height, true
			}
		}
	}
	return height, ok
}

// unattendedAfter is how long a round may go without a witness report
// before status says that no trainer may be left (a round's reports come
// within seconds of its start on a healthy run).
const unattendedAfter = 10 * time.Second

func viewOf(s *coordinator.Coordinator, now time.Time) statusView {
	v := statusView{RunID: s.RunIDString(), State: s.RunState.String(), StateSince: s.RunStateStart,
		Epoch: s.Progress.Epoch, Step: s.Progress.Step, Nonce: s.Nonce, PendingPause: s.PendingPause,
		Clients: []clientView{}, Pending: []string{}, Exited: []clientView{}}
	client := func(cl coordinator.Client) clientView {
		// The p2p id as libp2p, the logs and the explorer print it.
		return clientView{Address: cl.ID.Signer.String(), P2P: explorer.PeerID(cl.ID.P2P), State: clientLabel(s, cl), Height: cl.ExitedHeight}
	}
	inRounds := s.RunState == coordinator.RoundTrain || s.RunState == coordinator.RoundWitness
	for i, cl := range s.Epoch.Clients[:s.Epoch.ClientsLen] {
		c := client(cl)
		if inRounds && c.State == labelHealthy {
			c.seenKnown = true
			if h, ok := lastSeen(s, i); ok {
				c.LastSeen = &h
			}
		}
		v.Clients = append(v.Clients, c)
	}
	if r := s.CurrentRound(); inRounds && r.WitnessesLen == 0 && now.Unix()-int64(s.RunStateStart) >= int64(unattendedAfter/time.Second) {
		v.Unattended = fmt.Sprintf("nobody has reported in round %d for %s: if the trainers are gone, nobody is left to drop them (trainers drop each other); "+
			"the round ends at its limit (max_round_train_time %d s, then round_witness_time %d s) without a witness, and the epoch with it, withdrawing them",
			r.Height, (time.Duration(now.Unix()-int64(s.RunStateStart)) * time.Second).String(), s.Config.MaxRoundTrainTime, s.Config.RoundWitnessTime)
	}
	for _, cl := range s.Epoch.Exited[:s.Epoch.ExitedLen] {
		v.Exited = append(v.Exited, client(cl))
	}
	for _, id := range s.Pending[:s.PendingLen] {
		v.Pending = append(v.Pending, id.Signer.String())
	}
	if epochInProgress(s.RunState) {
		r := s.CurrentRound()
		v.Round = &roundView{Height: r.Height, DataIndex: r.DataIndex, BatchSize: s.RoundBatchSize(r),
			Witnesses: int(r.WitnessesLen), Of: s.Config.WitnessCount(r.ClientsLen)}
	}
	v.Checkpoint.Kind = s.Model.Checkpoint.Kind.String()
	v.Checkpoint.URL = coordinator.FixedString(s.Model.Checkpoint.Source.URL[:])
	v.Checkpoint.Store = coordinator.FixedString(s.Model.Store.URL[:])
	v.Checkpoint.Endpoint = coordinator.FixedString(s.Model.Store.Endpoint[:])
	v.Checkpoint.Revision = coordinator.FixedString(s.Model.Checkpoint.Source.Revision[:])
	return v
}

func status(c *cli.Context) error {
	if c.Bool("history") {
		return printHistory(c)
	}
	b, _, err := backend(c, false)
	if err != nil {
		return err
	}
	snap, err := b.Snapshot(c.Context, c.String("run-id"))
	if err != nil {
		return err
	}
	v := viewOf(snap.State, time.Now())
	v.Data = dataViewOf(c.Context, snap.State, c.String("server"), len(c.StringSlice("rpc")) == 0)
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if fed := federatedInfo(c); fed != nil {
			return enc.Encode(withFederated{v, fed})
		}
		return enc.Encode(v)
	}
	printStatus(c.App.Writer, v)
	if fed := federatedInfo(c); fed != nil {
		printFederated(c.App.Writer, fed)
	}
	return nil
}

func printStatus(w io.Writer, v statusView) {
	fmt.Fprintf(w, "run %s: %s since %s, epoch %d, step %d (nonce %d)\n", v.RunID, v.State,
		time.Unix(int64(v.StateSince), 0).UTC().Format(time.RFC3339), v.Epoch, v.Step, v.Nonce)
	if v.PendingPause {
		fmt.Fprintln(w, "a pause is pending: the run pauses when this epoch ends")
	}
	if v.Round != nil {
		fmt.Fprintf(w, "round %d: data [%d, %d), witnesses %d/%d\n", v.Round.Height, v.Round.DataIndex,
			v.Round.DataIndex+uint64(v.Round.BatchSize), v.Round.Witnesses, v.Round.Of)
	}
	printData(w, v.Data)
	if v.Unattended != "" {
		fmt.Fprintln(w, v.Unattended)
	}
	fmt.Fprintf(w, "checkpoint: %s %s %s\n", v.Checkpoint.Kind, v.Checkpoint.URL, v.Checkpoint.Revision)
	if v.Checkpoint.Store != "" {
		at := v.Checkpoint.Endpoint
		if at == "" {
			at = "AWS S3"
		}
		fmt.Fprintf(w, "checkpoint store: %s at %s\n", v.Checkpoint.Store, at)
	}
	// There is a round only while an epoch is in progress; otherwise the
	// clients are those of the epoch that ended.
	if v.Round == nil && len(v.Clients) > 0 {
		fmt.Fprintf(w, "clients of the last epoch (%d):\n", len(v.Clients))
	} else {
		fmt.Fprintf(w, "clients (%d):\n", len(v.Clients))
	}
	// Addresses are 32-44 characters: the column is as wide as the longest.
	width := 0
	for _, cl := range slices.Concat(v.Clients, v.Exited) {
		width = max(width, len(cl.Address))
	}
	for _, cl := range v.Clients {
		fmt.Fprintf(w, "  %-*s %s\n", width, cl.Address, clientStatus(cl, v.Round))
	}
	if len(v.Pending) > 0 {
		fmt.Fprintf(w, "pending for the next epoch (%d):\n", len(v.Pending))
		for _, p := range v.Pending {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	if len(v.Exited) > 0 {
		// The coordinator's Exited list: the members of the epoch before
		// this one and the clients removed during this one. Its labels say
		// where each is now (a member who stayed on is Healthy above too).
		fmt.Fprintf(w, "last epoch's members and this epoch's removals (%d):\n", len(v.Exited))
		for _, cl := range v.Exited {
			fmt.Fprintf(w, "  %-*s %s\n", width, cl.Address, clientStatus(cl, nil))
		}
	}
}

// clientStatus is a client's label, with the round of a removal, and for
// a member in the epoch's rounds (round: the current one) when it was last
// seen.
func clientStatus(cl clientView, round *roundView) string {
	switch cl.State {
	case labelHealthy:
		switch {
		case !cl.seenKnown || round == nil:
			return cl.State
		case cl.LastSeen == nil:
			return fmt.Sprintf("%s, not seen in the last %d rounds", cl.State, min(round.Height+1, coordinator.NumRounds))
		case *cl.LastSeen == round.Height:
			return cl.State + ", seen in this round"
		default:
			return fmt.Sprintf("%s, last seen in round %d", cl.State, *cl.LastSeen)
		}
	case labelPending, labelLeft:
		return cl.State
	}
	return fmt.Sprintf("%s at round %d", cl.State, cl.Height)
}

// printHistory copies the run's history CSV from the explorer (the
// server's own, by default) to stdout.
func printHistory(c *cli.Context) error {
	base := c.String("explorer")
	if base == "" {
		if len(c.StringSlice("rpc")) > 0 {
			return errors.New("--history: a Solana run's history is kept by a psyche explorer: pass its URL with --explorer")
		}
		base = c.String("server")
	}
	u := strings.TrimRight(base, "/") + "/api/runs/" + url.PathEscape(c.String("run-id")) + "/history.csv"
	req, err := http.NewRequestWithContext(c.Context, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("--history: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("--history: %s answered %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	_, err = io.Copy(c.App.Writer, resp.Body)
	return err
}
