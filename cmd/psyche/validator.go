package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/psyche-go/psyche/chain/solana"
	program "github.com/psyche-go/psyche/programs/coordinator"
	"github.com/psyche-go/psyche/programs/validator"
	"github.com/urfave/cli/v2"
)

var validatorCommand = &cli.Command{
	Name:  "validator",
	Usage: "run a local Solana validator (litesvm) with the coordinator program loaded",
	Description: `Starts the repository's local validator (scripts/validator: Node 20 and litesvm)
on 127.0.0.1 with the coordinator program preloaded at the address --program-id
defaults to, and prints where it listens. Slots and the Clock follow wall time.`,
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "port", Value: 8899, Usage: "port for JSON-RPC; the websocket is on the port + 1 (and on the port itself) (0: any free pair)", Category: "VALIDATOR"},
	},
	Action: runValidator,
}

func runValidator(c *cli.Context) error {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "psyche-validator-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	so := filepath.Join(dir, "coordinator.so")
	if err := os.WriteFile(so, program.Program, 0o644); err != nil {
		return err
	}
	v, err := validator.Start(ctx, validator.WithPort(c.Int("port")),
		validator.WithProgram(solana.LocalProgramID.String(), so), validator.WithLogger(logger(c)))
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "validator: rpc %s, websocket %s, coordinator program %s\n", v.RPC, v.WebSocket, solana.LocalProgramID)
	return v.Run(ctx)
}
