package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"syscall"

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
		Commands:  append([]*cli.Command{localnetCommand, joinCommand, initModelCommand, dataCommand, parityCommand, validatorCommand, relayCommand, explorerCommand, federatedTokenCommand}, adminCommands...),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format: text or json", Category: "LOGGING"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: debug, info, warn or error", Category: "LOGGING"},
		},
		Before: func(c *cli.Context) error {
			if f := c.String("log-format"); f != "text" && f != "json" {
				return fmt.Errorf("--log-format must be text or json, not %q", f)
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
				return fmt.Errorf("--log-level must be debug, info, warn or error, not %q", c.String("log-level"))
			}
			return nil
		},
		ExitErrHandler: func(*cli.Context, error) {
			// run() reports errors; the default handler would os.Exit.
		},
		Version: version(),
		// Without a command: the help. With one that does not exist: the
		// nearest that does (urfave/cli said "No help topic for 'jion'").
		Action: func(c *cli.Context) error {
			if !c.Args().Present() {
				return cli.ShowAppHelp(c)
			}
			name := c.Args().First()
			if near := nearestCommand(c.App, name); near != "" {
				return fmt.Errorf("%q is not a psyche command; did you mean %q? (psyche --help lists them)", name, near)
			}
			return fmt.Errorf("%q is not a psyche command (psyche --help lists them)", name)
		},
	}
	withSolanaFlags(app.Commands)
	deriveEnvVars(&cli.Command{Flags: app.Flags, Subcommands: app.Commands})
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
		case *cli.StringSliceFlag:
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
	walk(append([]*cli.Command{{Flags: app.Flags}}, app.Commands...))
	return known
}

func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

// runContext runs the app until it returns or ctx ends (tests stop
// long-running commands this way).
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	known := knownEnv(app)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && !known[name] {
			fmt.Fprintf(stderr, "warning: unknown environment variable %s (no psyche flag reads it)\n", name)
		}
	}
	if err := app.RunContext(ctx, args); err != nil {
		fmt.Fprintf(stderr, "psyche: %v\n", err)
		if errors.Is(err, syscall.ECONNREFUSED) {
			// The most common first-hour error: no server where the
			// command looked (the default is 127.0.0.1:7600).
			fmt.Fprintln(stderr, "psyche: nothing listens at that address: start `psyche server` there, or point --server (PSYCHE_SERVER) or --rpc at a running one")
		}
		return 1
	}
	return 0
}

// logger builds the process's logger from the global logging flags; logs go
// to stderr so that stdout stays for results.
func logger(c *cli.Context) *slog.Logger { return loggerTo(c, c.App.ErrWriter) }

// loggerTo is logger writing to w.
func loggerTo(c *cli.Context, w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.String("log-format") == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// listen opens a TCP listener.
func listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// version is the build's: the module version and, for a build from a git
// checkout, the commit (and whether it had uncommitted changes).
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if rev != "" {
		v += fmt.Sprintf(" (commit %.12s%s)", rev, modified)
	}
	return v + ", " + bi.GoVersion
}

// nearestCommand is the command whose name (or alias) is closest to name,
// at most two edits away; "" if none is.
func nearestCommand(app *cli.App, name string) string {
	best, bestD := "", 3
	for _, cmd := range app.Commands {
		for _, n := range cmd.Names() {
			if d := editDistance(name, n); d < bestD {
				best, bestD = cmd.Name, d
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in runes,
// counting a swap of two neighbours as one edit ("jion" is one from "join").
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}
