package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/explorer"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/urfave/cli/v2"
)

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
	fed, err := mountFederated(ctx, c.String("dir"), c.Bool("browser-trainer"), logger(c), reg, &s)
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
