package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/psyche-go/psyche/trainer/start"
	"github.com/urfave/cli/v2"
)

var joinCommand = &cli.Command{
	Name:  "join",
	Usage: "train in a run: join every epoch, train, exchange results, witness, checkpoint",
	Flags: []cli.Flag{serverFlag, keyFlag, runIDFlag,
		&cli.StringFlag{Name: "p2p-key", Value: "psyche-p2p.key", Usage: "p2p identity key file (created if missing)", Category: "P2P"},
		&cli.StringSliceFlag{Name: "listen", Value: cli.NewStringSlice("/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"), Usage: "p2p listen addresses (multiaddrs)", Category: "P2P"},
		&cli.StringSliceFlag{Name: "peer", Usage: "address of another trainer (multiaddr ending in /p2p/<id>); repeatable", Category: "P2P"},
		&cli.StringFlag{Name: "checkpoint-dir", Value: "checkpoints", Usage: "where to save checkpoints when elected", Category: "RUN"},
		&cli.IntFlag{Name: "epochs", Usage: "leave after training this many epochs (0: until the run finishes)", Category: "RUN"},
		&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics on this address (e.g. 127.0.0.1:9100)", Category: "METRICS"},
		&cli.BoolFlag{Name: "tick", Usage: "send tick transactions when the run's timers say a transition is due (default: on with --rpc, where no server ticks the run)", Category: "RUN"},
	},
	Action: join,
}

func join(c *cli.Context) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, signer, err := backend(c, true)
	if err != nil {
		return err
	}
	// On a terminal the progress is one live line, and log lines are
	// written above it.
	interactive := isTerminal(c.App.Writer)
	status := &statusLine{term: c.App.Writer}
	log := logger(c)
	if interactive {
		log = loggerTo(c, status.LogWriter(c.App.ErrWriter))
	}
	key, err := libp2p.LoadOrCreateKey(c.String("p2p-key"))
	if err != nil {
		return err
	}
	reg := newRegistry()
	if err := os.MkdirAll(c.String("checkpoint-dir"), 0o755); err != nil {
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
		node.WithCheckpointDir(c.String("checkpoint-dir")), node.WithLogger(log), node.WithEpochs(c.Int("epochs")),
		node.WithMetrics(node.NewMetrics(reg))}
	if tick := c.Bool("tick"); tick || (!c.IsSet("tick") && len(c.StringSlice("rpc")) > 0) {
		opts = append(opts, node.WithTicking())
	}
	var pn *libp2p.Node
	nd, pn, err := start.Trainer(ctx, c.String("run-id"), b, signer, []libp2p.Option{libp2p.WithListenAddrs(c.StringSlice("listen")...),
		libp2p.WithKey(key), libp2p.WithLogger(log), libp2p.WithMetrics(libp2p.NewMetrics(reg))}, append(opts,
		node.WithProgress(func(p node.Progress) {
			if !interactive || time.Since(last) < 200*time.Millisecond {
				return
			}
			last = time.Now()
			status.Set(joinStatus(p, len(pn.Peers())))
		}))...)
	if err != nil {
		return err
	}
	defer pn.Close()
	for _, a := range pn.Addrs() {
		fmt.Fprintf(c.App.Writer, "p2p address: %s\n", a)
	}
	err = nd.Run(ctx)
	status.Done()
	return err
}

// joinStatus is the live progress line; the loss appears once a batch has
// been trained (before that there is none to show).
func joinStatus(p node.Progress, peers int) string {
	loss := "-"
	if p.Tokens > 0 {
		loss = fmt.Sprintf("%.3f", p.Loss)
	}
	return fmt.Sprintf("%-17s epoch %d step %d loss %s tokens %d peers %d sent %s received %s",
		p.State, p.Epoch, p.Step, loss, p.Tokens, peers, bytesString(p.Sent), bytesString(p.Received))
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
