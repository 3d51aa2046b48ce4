package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/BurntSushi/toml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/browser/web"
	"github.com/psyche-go/psyche/federated/dp"
	"github.com/psyche-go/psyche/federated/fedclient"
	"github.com/psyche-go/psyche/federated/fedserver"
	"github.com/urfave/cli/v2"
)

// federatedSection is the run file's [federated] section: a server-backend
// setting kept out of the coordinator account (whose layout the Go and C
// coordinators share byte for byte). See examples/federated-run.toml.
type federatedSection struct {
	Mode                 string  `toml:"mode"`
	Capacity             uint32  `toml:"capacity"`
	MaxStaleness         uint32  `toml:"max_staleness"`
	RoundDuration        uint32  `toml:"round_duration"`
	Rounds               uint32  `toml:"rounds"`
	Aggregation          string  `toml:"aggregation"`
	ServerLR             float32 `toml:"server_lr"`
	Clip                 float32 `toml:"clip"`
	NoiseMultiplier      float32 `toml:"noise_multiplier"`
	LocalNoiseMultiplier float32 `toml:"local_noise_multiplier"`
	TargetEpsilon        float64 `toml:"target_epsilon"`
	Population           uint32  `toml:"population"`
	Delta                float64 `toml:"delta"`
	SecAgg               bool    `toml:"secagg"`
	SecAggThreshold      uint32  `toml:"secagg_threshold"`
	SecAggTimeout        uint32  `toml:"secagg_timeout"`
	SecAggNeighbors      uint32  `toml:"secagg_neighbors"`
}

// loadFederated reads the run file's [federated] section (nil if it has
// none).
func loadFederated(path string) (*federated.Config, error) {
	var f struct {
		Federated *federatedSection `toml:"federated"`
		Model     *struct {
			Optimizer struct {
				Aggregation string `toml:"aggregation"`
			} `toml:"optimizer"`
		} `toml:"model"`
	}
	if err := refuseNegative(path); err != nil {
		return nil, err
	}
	md, err := toml.DecodeFile(path, &f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s := f.Federated
	if s == nil {
		return nil, nil
	}
	if !md.IsDefined("federated", "clip") {
		// Clipping is on unless the run file turns it off (clip = 0).
		s.Clip = federated.DefaultClip
	}
	if s.Mode != "federated" {
		return nil, fmt.Errorf("%s: federated.mode = %q: the only mode is \"federated\"", path, s.Mode)
	}
	cfg := &federated.Config{Capacity: s.Capacity, MaxStaleness: s.MaxStaleness, RoundDuration: s.RoundDuration, Rounds: s.Rounds,
		ServerLR: s.ServerLR, Clip: s.Clip, NoiseMultiplier: s.NoiseMultiplier, LocalNoiseMultiplier: s.LocalNoiseMultiplier,
		Population: s.Population, Delta: s.Delta, SecAgg: s.SecAgg, SecAggThreshold: s.SecAggThreshold,
		SecAggTimeout: s.SecAggTimeout, SecAggNeighbors: s.SecAggNeighbors}
	// The aggregation is the section's, else the run's own rule.
	agg := s.Aggregation
	if agg == "" && f.Model != nil {
		agg = f.Model.Optimizer.Aggregation
	}
	if agg != "" {
		a, err := federated.ParseAggregation(agg)
		if err != nil {
			return nil, fmt.Errorf("%s: federated.aggregation: %w", path, err)
		}
		cfg.Aggregation = a
	}
	if s.TargetEpsilon > 0 {
		if s.NoiseMultiplier > 0 {
			return nil, fmt.Errorf("%s: federated: set noise_multiplier or target_epsilon, not both", path)
		}
		if s.Rounds == 0 {
			return nil, fmt.Errorf("%s: federated.target_epsilon needs rounds > 0 (the budget is spread over them)", path)
		}
		sigma, err := dpNoiseFor(s.TargetEpsilon, cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: federated.target_epsilon: %w", path, err)
		}
		cfg.NoiseMultiplier = float32(sigma)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%s: [federated]: %w", path, err)
	}
	return cfg, nil
}

// configureFederated sends a run file's [federated] section to the server.
func configureFederated(c *cli.Context, cfg *federated.Config) error {
	if len(c.StringSlice("rpc")) > 0 {
		return errors.New("the run file's [federated] section needs the server backend (--server, not --rpc): federated runs live on the server")
	}
	k, err := chain.LoadKeypair(c.String("key"))
	if err != nil {
		return err
	}
	in, err := fedclient.New(c.String("server"), c.String("run-id"), k).Configure(c.Context, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "federated: ok (round %d, %d parameters, capacity %d, %s%s)\n", in.Round, in.Params, in.Capacity,
		in.Aggregation, privacyText(in))
	return nil
}

func privacyText(in *federated.Info) string {
	s := ""
	if in.NoiseMultiplier > 0 {
		s += fmt.Sprintf(", central DP σ=%.3g clip %g q=%.3g", in.NoiseMultiplier, in.Clip, in.SamplingRate)
	}
	if in.LocalNoiseMultiplier > 0 {
		s += fmt.Sprintf(", local DP σ=%.3g clip %g", in.LocalNoiseMultiplier, in.Clip)
	}
	if in.SecAgg {
		s += ", secure aggregation"
	}
	return s
}

// federatedInfo is the run's federated state for psyche status, nil if the
// run is not federated (or lives on Solana).
func federatedInfo(c *cli.Context) *federated.Info {
	if len(c.StringSlice("rpc")) > 0 {
		return nil
	}
	in, err := fedclient.New(c.String("server"), c.String("run-id"), nil).Info(c.Context)
	if err != nil {
		return nil
	}
	return in
}

// withFederated is psyche status --json for a federated run: the run's
// fields and a "federated" object (federated.Info, ε included).
type withFederated struct {
	statusView
	Federated *federated.Info `json:"federated"`
}

// printFederated adds a federated run's state to psyche status.
func printFederated(w io.Writer, in *federated.Info) {
	fmt.Fprintf(w, "federated: round %d", in.Round)
	if in.Rounds > 0 {
		fmt.Fprintf(w, "/%d", in.Rounds)
	}
	fmt.Fprintf(w, ", buffer %d/%d, %d updates aggregated, %s%s\n", in.Buffered, in.Capacity, in.Contributions, in.Aggregation, privacyText(in))
	if in.Epsilon != nil {
		fmt.Fprintf(w, "privacy spent: ε = %.4g at δ = %g (central, RDP accountant)\n", *in.Epsilon, in.Delta)
	}
	if in.EpsilonLocal != nil {
		fmt.Fprintf(w, "privacy spent: ε = %.4g at δ = %g per client (local noise)\n", *in.EpsilonLocal, in.Delta)
	}
}

// mountFederated builds the federated service for psyche server: its state
// lives in <dir>/federated, and it reads the runs from the server that
// *srv will hold once it exists (before it serves); a freed run's state
// goes with it. The browser trainer's page comes with it unless browser is
// false: its module is the binary's, or one built from the binary's
// source in the background once a federated run exists or a visitor asks
// for it (the log says which, or why the page cannot train).
func mountFederated(ctx context.Context, dir string, browser bool, log *slog.Logger, reg prometheus.Registerer, srv **server.Server) ([]server.Option, error) {
	var page *web.Page
	if browser {
		page = web.NewPage(web.WithLogger(log))
	} else {
		page = web.NewPage(web.WithLogger(log), web.WithOff(browserOff))
	}
	fed, err := fedserver.New(filepath.Join(dir, "federated"), func(id string) ([]byte, bool) { return (*srv).Account(id) },
		fedserver.WithLogger(log), fedserver.WithMetrics(fedserver.NewMetrics(reg)), fedserver.WithOnRun(func(string) { page.Need() }))
	if err != nil {
		return nil, err
	}
	go func() { _ = page.Run(ctx) }()
	return []server.Option{server.WithRoutes(fed.Routes), server.WithRoutes(page.Routes), server.WithOnFree(fed.Forget)}, nil
}

// browserOff is what /train/<run> answers on a server started with
// --browser-trainer=false.
const browserOff = "the browser trainer is off on this server (psyche server --browser-trainer=false, or PSYCHE_BROWSER_TRAINER=false); " +
	"join its federated runs with psyche join --local-data"

// dpNoiseFor is the central noise multiplier that spends target ε over
// the config's rounds.
func dpNoiseFor(target float64, cfg *federated.Config) (float64, error) {
	return dp.NoiseFor(target, cfg.SamplingRate(), uint64(cfg.Rounds), cfg.DeltaOrDefault())
}

// joinFederated is psyche join --local-data: a federated run's client.
func joinFederated(c *cli.Context, signer *chain.Keypair) error {
	if len(c.StringSlice("rpc")) > 0 {
		return errors.New("--local-data joins a federated run, which lives on the server backend (--server, not --rpc)")
	}
	// A malformed token is refused before anything else is done.
	var token []byte
	if t := c.String("join-token"); t != "" {
		var err error
		if token, err = hex.DecodeString(t); err != nil || len(token) != federated.JoinTokenSize {
			return fmt.Errorf("--join-token: want the %d hex characters psyche federated-token prints", 2*federated.JoinTokenSize)
		}
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	l, err := lockKey("key", c.String("key"))
	if err != nil {
		return err
	}
	defer l.Unlock()
	log := logger(c)
	run := c.String("run-id")
	b := serverclient.New(c.String("server"), log)
	snap, err := b.Snapshot(ctx, run)
	if err != nil {
		return err
	}
	m := &snap.State.Model
	text, err := os.ReadFile(c.String("local-data"))
	if err != nil {
		return fmt.Errorf("--local-data: %w", err)
	}
	t, opts, err := fedclient.ForRun(m, c.String("local-data"), text, c.Int("batch"), signer.Public())
	if err != nil {
		return err
	}
	d := t.Data
	client := fedclient.New(c.String("server"), run, signer)
	opts.Rounds, opts.Log, opts.JoinToken = uint64(c.Int("rounds")), log, token
	opts.OnRound = func(r fedclient.Round) {
		fmt.Fprintf(c.App.Writer, "federated round %d heldout loss %.4f train loss %.4f sent %d stale %v\n",
			r.Round, r.HeldoutLoss, r.TrainLoss, r.Sent, r.Stale)
	}
	log.Info("joining a federated run", "run", run, "address", signer.Public().String(), "local_data", d.Path,
		"train_tokens", len(d.Train), "heldout_tokens", len(d.Heldout))
	return fedclient.Participate(ctx, client, t, opts)
}

// federatedTokenCommand is how a federated run's join authority lets a
// client in: it signs a token for the client's key, which the client passes
// to psyche join --join-token (a trainer's join_run is co-signed instead).
var federatedTokenCommand = &cli.Command{
	Name:  "federated-token",
	Usage: "as a federated run's join authority, print the token that lets one client's key join it (psyche join --local-data --join-token)",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "authority-key", Value: defaultKeyPath(), Usage: "the run's join authority's key file", Category: "IDENTITY"},
		&cli.StringFlag{Name: "run-id", Required: true, Usage: "the federated run", Category: "RUN"},
		&cli.StringFlag{Name: "client", Required: true, Usage: "the client's address (psyche keygen prints it)", Category: "RUN"},
	},
	Action: func(c *cli.Context) error {
		k, err := chain.LoadKeypair(c.String("authority-key"))
		if err != nil {
			return fmt.Errorf("--authority-key: %w", err)
		}
		client, err := coordinator.ParsePubkey(c.String("client"))
		if err != nil {
			return fmt.Errorf("--client: %w", err)
		}
		token, err := federated.JoinToken(k, c.String("run-id"), client)
		if err != nil {
			return fmt.Errorf("--run-id: %w", err)
		}
		fmt.Fprintln(c.App.Writer, hex.EncodeToString(token))
		return nil
	},
}
