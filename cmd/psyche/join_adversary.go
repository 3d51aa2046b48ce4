//go:build adversary

package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/psyche-go/psyche/trainer/node"
	"github.com/urfave/cli/v2"
)

// The adversary build's join: --adversary KIND makes this trainer misbehave,
// and every trainer prints its peak heap when it leaves, so that
// scripts/bench-adversary can compare one honest trainer's memory (its own
// process) under each attack with its memory in an honest run. The default
// binary has neither.
func init() {
	joinCommand.Flags = append(joinCommand.Flags, &cli.StringFlag{Name: "adversary",
		Usage: "make this trainer adversarial: " + strings.Join(node.Adversaries, ", "), Category: "RUN"})
	joinAdversary = func(ctx context.Context, c *cli.Context) ([]node.Option, func(), error) {
		var opts []node.Option
		if kind := c.String("adversary"); kind != "" {
			o, err := node.WithAdversary(kind)
			if err != nil {
				return nil, nil, err
			}
			opts = append(opts, o)
		}
		ctx, stop := context.WithCancel(ctx)
		heap := watchHeap(ctx)
		return opts, func() {
			stop()
			fmt.Fprintf(c.App.Writer, "peak heap: %d bytes\n", heap())
		}, nil
	}
}
