package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/urfave/cli/v2"
)

// psyche relay is the server backend's p2p host on its own, for Solana runs
// (where no server runs one): a DHT bootstrap host for the runs named and a
// circuit relay for trainers that cannot reach each other directly.
var relayCommand = &cli.Command{
	Name:  "relay",
	Usage: "run a p2p bootstrap host and circuit relay for runs whose trainers are behind NATs (Solana runs; the server backend has its own: psyche server --relay)",
	Flags: []cli.Flag{
		&cli.StringSliceFlag{Name: "listen", Value: cli.NewStringSlice("/ip4/0.0.0.0/tcp/7601", "/ip4/0.0.0.0/udp/7601/quic-v1"), Usage: "listen addresses (multiaddrs); a fixed port, so that its address can go into run instructions", Category: "P2P"},
		&cli.StringFlag{Name: "p2p-key", Value: filepath.Join(filepath.Dir(defaultKeyPath()), "relay.p2p.key"), Usage: "the relay's identity key (created if missing)", Category: "P2P"},
		&cli.StringSliceFlag{Name: "run-id", Usage: "a run whose DHT to serve, so that its trainers can bootstrap from here (repeatable)", Category: "RUN"},
		&cli.IntFlag{Name: "max-reservations", Value: 4096, Usage: "peers the relay serves at once: it is open to anyone, so this is its bound", Category: "P2P"},
		&cli.IntFlag{Name: "max-reservations-per-ip", Value: 256, Usage: "peers from one IP address the relay serves at once", Category: "P2P"},
	},
	Action: runRelay,
}

func runRelay(c *cli.Context) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(filepath.Dir(c.String("p2p-key")), 0o700); err != nil {
		return err
	}
	b, err := libp2p.NewBootstrap(libp2p.WithKeyFile(c.String("p2p-key")), libp2p.WithListenAddrs(c.StringSlice("listen")...),
		libp2p.WithLogger(logger(c)), libp2p.WithOpenRelay(),
		libp2p.WithRelayReservations(c.Int("max-reservations"), c.Int("max-reservations-per-ip")))
	if err != nil {
		return err
	}
	runs := map[string][]coordinator.Pubkey{}
	for _, id := range c.StringSlice("run-id") {
		if _, err := coordinator.ParseRunID(id); err != nil {
			b.Close()
			return err
		}
		// No members list: this relay does not follow the runs' state, so it
		// is an open one (WithOpenRelay), for anyone within its resource
		// limits.
		runs[id] = nil
	}
	b.SetRuns(runs)
	for _, a := range b.Addrs() {
		fmt.Fprintf(c.App.Writer, "relay address: %s\n", a)
	}
	fmt.Fprintf(c.App.Writer, "trainers: psyche join --relay <address> --bootstrap <address> ...\n")
	return b.Run(ctx)
}
