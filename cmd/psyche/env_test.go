package main

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestEnvVarsMeanOneThing: every PSYCHE_* variable is read by one flag, so
// a variable set for one command cannot reach another as something else
// (PSYCHE_LISTEN=0.0.0.0:7600, the server's form, reached join as a
// multiaddr).
func TestEnvVarsMeanOneThing(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	readers := map[string]map[cli.Flag][]string{}
	walkFlags(&cli.Command{Flags: app.Flags, Subcommands: app.Commands}, nil, func(path []string, f cli.Flag) {
		for _, v := range f.(interface{ GetEnvVars() []string }).GetEnvVars() {
			if readers[v] == nil {
				readers[v] = map[cli.Flag][]string{}
			}
			readers[v][f] = append(readers[v][f], "psyche "+slices.Concat(path, []string{"--" + f.Names()[0]})[0])
		}
	})
	for v, fs := range readers {
		if len(fs) > 1 {
			t.Errorf("%s is read by %d different flags: %v", v, len(fs), fs)
		}
	}
	for _, tc := range []struct{ env, cmd, flag string }{
		{"PSYCHE_SERVER_LISTEN", "server", "listen"},
		{"PSYCHE_JOIN_LISTEN", "join", "listen"},
		{"PSYCHE_SERVER", "join", "server"},
		{"PSYCHE_SERVER", "tick", "server"},
		{"PSYCHE_PRECISION", "localnet", "precision"},
		{"PSYCHE_TRAINERS", "localnet", "trainers"},
		// --run-id is one flag every admin command and join share (the
		// explorer's and the relay's are lists): it read
		// PSYCHE_CHECKPOINT_RUN_ID, the last command's name, everywhere.
		{"PSYCHE_RUN_ID", "status", "run-id"},
		{"PSYCHE_RUN_ID", "join", "run-id"},
		{"PSYCHE_RUN_ID", "update", "run-id"},
		{"PSYCHE_EXPLORER_RUN_ID", "explorer", "run-id"},
		{"PSYCHE_RELAY_RUN_ID", "relay", "run-id"},
	} {
		var got []string
		for _, c := range app.Commands {
			if c.Name != tc.cmd {
				continue
			}
			for _, f := range c.Flags {
				if f.Names()[0] == tc.flag {
					got = f.(interface{ GetEnvVars() []string }).GetEnvVars()
				}
			}
		}
		if !slices.Equal(got, []string{tc.env}) {
			t.Errorf("psyche %s --%s reads %v, want %s", tc.cmd, tc.flag, got, tc.env)
		}
	}
	if readers["PSYCHE_LISTEN"] != nil {
		t.Error("PSYCHE_LISTEN still means something")
	}
}

// TestUnknownEnvWarned: a PSYCHE_* variable nothing reads (a typo) is
// warned of; a flag's variable and PSYCHE_TORCH_ENV, which the torch engine
// reads without a flag (where scripts/setup-torch installed), are not.
func TestUnknownEnvWarned(t *testing.T) {
	for _, tc := range []struct {
		name string
		warn bool
	}{
		{"PSYCHE_SERVR", true},
		{"PSYCHE_SERVER", false},
		{"PSYCHE_TORCH_ENV", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.name, "x")
			var stderr strings.Builder
			run([]string{"psyche", "--help"}, io.Discard, &stderr)
			want := "warning: unknown environment variable " + tc.name + " "
			if got := strings.Contains(stderr.String(), want); got != tc.warn {
				t.Errorf("warned: %v, want %v (stderr %q)", got, tc.warn, stderr.String())
			}
		})
	}
}
