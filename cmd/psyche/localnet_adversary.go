//go:build adversary

package main

import (
	"fmt"
	"strings"

	"github.com/psyche-go/psyche/trainer/node"
	"github.com/urfave/cli/v2"
)

// The adversary build (go run -tags adversary ./cmd/psyche localnet
// --adversary KIND) makes localnet's last trainer misbehave, for
// scripts/bench-adversary. The default binary has neither the flag nor the
// behaviour.
func init() {
	localnetCommand.Flags = append(localnetCommand.Flags, &cli.StringFlag{Name: "adversary",
		Usage: "make the last trainer adversarial: " + strings.Join(node.Adversaries, ", "), Category: "RUN"})
	localnetAdversary = func(c *cli.Context) ([]node.Option, error) {
		kind := c.String("adversary")
		if kind == "" {
			return nil, nil
		}
		if c.Int("trainers") < 2 {
			return nil, fmt.Errorf("--adversary needs at least 2 trainers")
		}
		o, err := node.WithAdversary(kind)
		if err != nil {
			return nil, err
		}
		return []node.Option{o}, nil
	}
}
