package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
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
		Commands:  append([]*cli.Command{localnetCommand, joinCommand, generateCommand, exportCommand, initModelCommand, dataCommand, parityCommand, validatorCommand, relayCommand, explorerCommand, federatedTokenCommand}, adminCommands...),
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
	app.OnUsageError = usageError("psyche", func() []cli.Flag { return app.Flags })
	var withUsage func(path string, cmds []*cli.Command)
	withUsage = func(path string, cmds []*cli.Command) {
		for _, cmd := range cmds {
			cmd.OnUsageError = usageError(path+" "+cmd.Name, func() []cli.Flag { return cmd.Flags })
			withUsage(path+" "+cmd.Name, cmd.Subcommands)
		}
	}
	withUsage("psyche", app.Commands)
	return app
}

// usageError says a flag that does not parse in one line, naming the
// nearest flag the command has for one it does not ("did you mean
// --engine?") and where its flags are listed. urfave/cli's default printed
// the command's whole help first (63 lines for localnet), which buried the
// one line that mattered.
func usageError(cmd string, flags func() []cli.Flag) cli.OnUsageErrorFunc {
	return func(_ *cli.Context, err error, _ bool) error {
		help := fmt.Sprintf("(%s --help lists its flags)", cmd)
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
			name = strings.TrimLeft(name, "-")
			if near := nearestFlag(flags(), name); near != "" {
				return fmt.Errorf("--%s is not a flag of %s; did you mean --%s? %s", name, cmd, near, help)
			}
			return fmt.Errorf("--%s is not a flag of %s %s", name, cmd, help)
		}
		if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
			return fmt.Errorf("--%s needs a value %s", strings.TrimLeft(name, "-"), help)
		}
		if m := badValue.FindStringSubmatch(msg); m != nil {
			return fmt.Errorf("--%s %q: want %s %s", m[2], m[1], valueKind(flags(), m[2]), help)
		}
		return fmt.Errorf("%s %s", msg, help)
	}
}

// badValue is Go's flag package's error for a value that does not parse
// ("invalid value "x" for flag -epochs: parse error"; for a boolean,
// "invalid boolean value "x" for -mdns: parse error").
var badValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-(\S+): (.*)$`)

// valueKind says what the flag called name takes, for a value that did
// not parse.
func valueKind(flags []cli.Flag, name string) string {
	for _, f := range flags {
		if !slices.Contains(f.Names(), name) {
			continue
		}
		switch f.(type) {
		case *cli.IntFlag:
			return "a whole number"
		case *cli.Uint64Flag:
			return "a whole number of 0 or more"
		case *cli.Float64Flag:
			return "a number"
		case *cli.BoolFlag:
			return "true or false"
		case *cli.DurationFlag:
			return "a duration such as 30s or 2m"
		}
	}
	return "another value"
}

// nearestFlag is the flag name (or long alias) closest to name, at most
// two edits away ("help" included: every command has it); "" if none is.
// One-letter aliases are never offered: every short typo is near them.
func nearestFlag(flags []cli.Flag, name string) string {
	best, bestD := "", 3
	for _, n := range append([]string{"help"}, flagNames(flags)...) {
		if len(n) < 2 {
			continue
		}
		if d := editDistance(name, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func flagNames(flags []cli.Flag) []string {
	var out []string
	for _, f := range flags {
		out = append(out, f.Names()...)
	}
	return out
}

// flagEnv is the environment variable of flag f of the command at path
// (its names from the top, empty for the global flags): PSYCHE_ and the
// flag's name in upper case with dashes as underscores, when every flag of
// that name in the whole tree is the one flag (shared by the commands that
// take it: --server, --key, --precision), so the variable means one thing,
// or when it is the one flag of that name many commands share (--run-id;
// ownsName); where commands define flags of the same name that mean
// different things (--listen: a host:port for the server, multiaddrs for
// join), the command's path comes first: PSYCHE_SERVER_LISTEN,
// PSYCHE_JOIN_LISTEN.
func flagEnv(path []string, f cli.Flag, shared bool) string {
	upper := func(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }
	name := upper(f.Names()[0])
	if shared || len(path) == 0 {
		return envPrefix + name
	}
	parts := make([]string, len(path))
	for i, p := range path {
		parts[i] = upper(p)
	}
	return envPrefix + strings.Join(parts, "_") + "_" + name
}

// walkFlags calls fn on every flag of cmd and its subcommands, with the
// path of the command that takes it.
func walkFlags(cmd *cli.Command, path []string, fn func(path []string, f cli.Flag)) {
	for _, f := range cmd.Flags {
		fn(path, f)
	}
	for _, sub := range cmd.Subcommands {
		walkFlags(sub, append(append([]string(nil), path...), sub.Name), fn)
	}
}

func deriveEnvVars(root *cli.Command) {
	flags := map[string]map[cli.Flag]int{} // flag name → the distinct flags of that name → how many commands take each
	walkFlags(root, nil, func(_ []string, f cli.Flag) {
		n := f.Names()[0]
		if flags[n] == nil {
			flags[n] = map[cli.Flag]int{}
		}
		flags[n][f]++
	})
	walkFlags(root, nil, func(path []string, f cli.Flag) {
		env := flagEnv(path, f, ownsName(flags[f.Names()[0]], f))
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
	})
}

// ownsName says whether f, among the distinct flags of its name (and how
// many commands take each), is the one PSYCHE_<FLAG> means: the only one,
// or the one flag several commands share (--run-id: every admin command
// and join) where the others are each one command's own (explorer's and
// relay's lists of runs), which then take the command's prefix.
func ownsName(same map[cli.Flag]int, f cli.Flag) bool {
	if len(same) == 1 {
		return true
	}
	if same[f] < 2 {
		return false
	}
	for g, n := range same {
		if g != f && n >= same[f] {
			return false
		}
	}
	return true
}

// knownEnv lists every variable a flag reads, and the one psyche reads
// without a flag: where scripts/setup-torch put the torch engine's
// environment (torch.SetupPython), which the script reads too.
func knownEnv(app *cli.App) map[string]bool {
	known := map[string]bool{"PSYCHE_TORCH_ENV": true}
	walkFlags(&cli.Command{Flags: app.Flags, Subcommands: app.Commands}, nil, func(_ []string, f cli.Flag) {
		if e, ok := f.(interface{ GetEnvVars() []string }); ok {
			for _, v := range e.GetEnvVars() {
				known[v] = true
			}
		}
	})
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
		fmt.Fprintf(stderr, "psyche: %s\n", userMessage(err))
		return 1
	}
	return 0
}

// logger builds the process's logger from the global logging flags; logs go
// to stderr so that stdout stays for results.
func logger(c *cli.Context) *slog.Logger { return loggerTo(c, c.App.ErrWriter) }

// loggerTo is logger writing to w.
func loggerTo(c *cli.Context, w io.Writer) *slog.Logger { return loggerAt(c, w, c.String("log-level")) }

// loggerAt is loggerTo at the level named levelName.
func loggerAt(c *cli.Context, w io.Writer, levelName string) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
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
