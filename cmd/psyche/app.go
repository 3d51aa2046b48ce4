package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

const envPrefix = "PSYCHE_"

// newApp builds the command tree. Every flag can also be set from an
// environment variable PSYCHE_<FLAG_NAME> (derived, never spelled by hand).
func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "psyche",
		Usage:     "train one neural network together over the internet",
		Writer:    stdout,
		ErrWriter: stderr,
		Commands:  []*cli.Command{localnetCommand, dataCommand, parityCommand},
		ExitErrHandler: func(*cli.Context, error) {
			// run() reports errors; the default handler would os.Exit.
		},
	}
	for _, cmd := range app.Commands {
		deriveEnvVars(cmd)
	}
	return app
}

// envName is the environment variable of a flag: PSYCHE_ and the flag's
// name in upper case with dashes as underscores.
func envName(f cli.Flag) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(f.Names()[0], "-", "_"))
}

func deriveEnvVars(cmd *cli.Command) {
	for _, f := range cmd.Flags {
		env := envName(f)
		switch f := f.(type) {
		case *cli.IntFlag:
			f.EnvVars = []string{env}
		case *cli.Uint64Flag:
			f.EnvVars = []string{env}
		case *cli.StringFlag:
			f.EnvVars = []string{env}
		case *cli.BoolFlag:
			f.EnvVars = []string{env}
		case *cli.Float64Flag:
			f.EnvVars = []string{env}
		case *cli.DurationFlag:
			f.EnvVars = []string{env}
		default:
			panic(fmt.Sprintf("psyche: flag --%s has a type without an environment variable", f.Names()[0]))
		}
	}
	for _, sub := range cmd.Subcommands {
		deriveEnvVars(sub)
	}
}

// knownEnv lists every variable a flag reads.
func knownEnv(app *cli.App) map[string]bool {
	known := map[string]bool{}
	var walk func(cmds []*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			for _, f := range c.Flags {
				known[envName(f)] = true
			}
			walk(c.Subcommands)
		}
	}
	walk(app.Commands)
	return known
}

func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	known := knownEnv(app)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && !known[name] {
			fmt.Fprintf(stderr, "warning: unknown environment variable %s (no psyche flag reads it)\n", name)
		}
	}
	if err := app.Run(args); err != nil {
		fmt.Fprintf(stderr, "psyche: %v\n", err)
		return 1
	}
	return 0
}
