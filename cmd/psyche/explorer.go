package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/chain/server"
	"github.com/psyche-go/psyche/chain/serverclient"
	"github.com/psyche-go/psyche/explorer"
	"github.com/urfave/cli/v2"
)

var explorerCommand = &cli.Command{
	Name:  "explorer",
	Usage: "serve the run explorer, a read-only web page that shows runs as they happen, for a server's runs or Solana runs",
	Description: `Follows the runs of the server at --server (all of them, or those named with
--run-id), or with --rpc the Solana runs named with --run-id (a cluster cannot list
them), and serves the page at --listen: the run list, and for each run its state and
timers, clients and their health, each round's witnesses and quorum, checkpoints,
and the loss curve, tokens/s and bytes sent per step. The page only reads.
psyche server serves the same page at its own address.`,
	Flags: []cli.Flag{serverFlag,
		&cli.StringSliceFlag{Name: "run-id", Usage: "a run to show (repeat it for more; needed with --rpc)", Category: "RUN"},
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:7700", Usage: "address to serve the page on", Category: "EXPLORER"},
		&cli.DurationFlag{Name: "refresh", Value: 2 * time.Second, Usage: "how often the backend is asked which runs exist (the runs themselves are streamed)", Category: "EXPLORER"}},
	Action: runExplorerCommand,
}

func runExplorerCommand(c *cli.Context) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ids := c.StringSlice("run-id")
	b, _, err := backend(c, false)
	if err != nil {
		return err
	}
	var src explorer.Source
	switch client, ok := b.(*serverclient.Client); {
	case len(ids) > 0:
		src = explorer.FixedRuns(b, ids...)
	case ok:
		src = explorer.NewSource(client.Runs, client.Subscribe)
	default:
		return errors.New("--rpc needs --run-id: a Solana cluster cannot list its runs")
	}
	ex, err := explorer.New(explorer.WithLogger(logger(c)), explorer.WithRefresh(c.Duration("refresh")))
	if err != nil {
		return err
	}
	l, err := listen(c.String("listen"))
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "explorer: http://%s/\n", l.Addr())
	return serveExplorer(ctx, l, ex, src, logger(c))
}

// serveExplorer serves ex's page on l and follows src until ctx ends.
func serveExplorer(ctx context.Context, l net.Listener, ex *explorer.Explorer, src explorer.Source, log *slog.Logger) error {
	go func() { _ = ex.Run(ctx, src) }()
	if err := explorer.ServeLimits.Serve(ctx, l, ex.Handler(), 2*time.Second); err != nil {
		log.Error("explorer stopped", "err", err)
		return fmt.Errorf("explorer: %w", err)
	}
	return nil
}

// serverSource follows a server's runs in process.
func serverSource(s *server.Server) explorer.Source {
	return explorer.NewSource(func(context.Context) ([]string, error) { return s.Runs(), nil }, s.Subscribe)
}
