package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goInternal is text of Go's libraries that a failing command must not
// print: it says nothing a user can act on.
var goInternal = []string{"unsupported protocol scheme", "dial tcp", "strconv.", "%!", "<nil>", "json: cannot unmarshal",
	"toml: line", "runmodel: ", "modelspec: ", "chain: ", "Get \"", "Post \"", "connect: connection refused"}

// TestErrorsFollowTheRule runs the commands' failure paths a new user
// meets and checks each error against the rule of docs/running.md: one
// line, what was wrong, where (file and key, flag or URL) and what to do,
// with no Go-internal text. Each case's want holds the where and the what
// to do.
func TestErrorsFollowTheRule(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	tiny, err := os.ReadFile(filepath.Join("..", "..", "examples", "tiny-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	unclosed := write("unclosed.toml", "[config\nwarmup_time = 1\n")
	zeroBatch := write("zero-batch.toml", strings.Replace(string(tiny), "global_batch_size_start = ", "global_batch_size_start = 0 #", 1))
	twoRules := write("two-rules.toml", strings.Replace(strings.Replace(string(tiny), "global_batch_size_start = ", "global_batch_size_start = 0 #", 1),
		"\nmin_clients = ", "\nmin_clients = 0 #", 1))
	negative := write("negative.toml", "[config]\nwarmup_time = -5\nepoch_time = -1\n")
	key := filepath.Join(dir, "admin.json")
	if _, errs, code := psyche(t, "keygen", "--out", key); code != 0 {
		t.Fatal(errs)
	}
	url, _ := startServer(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close() // a port nothing listens on
	if out, errs, code := psyche(t, "init-coordinator", "--server", url, "--key", key, "--run-id", "taken"); code != 0 {
		t.Fatalf("init-coordinator: %s %s", out, errs)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string // the where and the what to do
	}{
		{"an unclosed table", []string{"update", "--server", url, "--key", key, "--run-id", "tiny", "--config", unclosed},
			[]string{unclosed + " line 1:", "end table name", "fix the TOML"}},
		{"a rule the coordinator checks", []string{"update", "--server", url, "--key", key, "--run-id", "tiny", "--config", zeroBatch},
			[]string{zeroBatch + ": config.global_batch_size_start must be greater than 0"}},
		{"two rules", []string{"update", "--server", url, "--key", key, "--run-id", "tiny", "--config", twoRules},
			[]string{"config.min_clients must be greater than 0; config.global_batch_size_start must be greater than 0"}},
		{"two negative values", []string{"update", "--server", url, "--key", key, "--run-id", "tiny", "--config", negative},
			[]string{"config.epoch_time = -1: must not be negative; config.warmup_time = -5: must not be negative"}},
		{"a missing run file", []string{"update", "--server", url, "--key", key, "--run-id", "tiny", "--config", filepath.Join(dir, "none.toml")},
			[]string{"none.toml: no such file: give the path of a run file"}},
		{"--server not a URL", []string{"status", "--server", "notaurl", "--run-id", "tiny"},
			[]string{`--server "notaurl": not an http:// or https:// URL`, "http://127.0.0.1:7600"}},
		{"nothing at --server", []string{"status", "--server", closed, "--run-id", "tiny"},
			[]string{"nothing listens at " + closed + " (--server): start `psyche server` there"}},
		{"an invalid run id", []string{"status", "--server", url, "--run-id", "a b/c"},
			[]string{`--run-id "a b/c": not a valid run id: 1-32 characters`}},
		{"no such run", []string{"status", "--server", url, "--run-id", "nosuchrun"},
			[]string{`no such run: "nosuchrun" (--run-id): check the id, or create the run with psyche init-coordinator`}},
		{"join a run that does not exist", []string{"join", "--server", url, "--key", key, "--run-id", "nosuchrun", "--data-dir", dir, "--mdns=false"},
			[]string{"--run-id nosuchrun: no such run at this backend", "psyche init-coordinator"}},
		{"generate from a run file", []string{"generate", "--model", filepath.Join("..", "..", "examples", "tiny-run.toml"), "--prompt", "Of the"},
			[]string{"--model ../../examples/tiny-run.toml: a run file, not a checkpoint: give a .safetensors file"}},
		{"generate from nothing", []string{"generate", "--model", filepath.Join(dir, "none.safetensors"), "--prompt", "Of the"},
			[]string{"none.safetensors: no such file or directory: give a .safetensors file"}},
		{"a flag typo", []string{"localnet", "--engin", "torch"},
			[]string{"--engin is not a flag of psyche localnet; did you mean --engine?", "(psyche localnet --help lists its flags)"}},
		{"a global flag typo", []string{"--log-levl", "debug", "status", "--run-id", "x"},
			[]string{"--log-levl is not a flag of psyche; did you mean --log-level?"}},
		{"a flag without its value", []string{"status", "--run-id"},
			[]string{"--run-id needs a value (psyche status --help lists its flags)"}},
		{"a flag with a bad value", []string{"localnet", "--epochs", "many"},
			[]string{`--epochs "many": want a whole number (psyche localnet --help lists its flags)`}},
		{"create a run that exists", []string{"init-coordinator", "--server", url, "--key", key, "--run-id", "taken"},
			[]string{`run "taken" exists already (Uninitialized, epoch 0, step 0): remove it with psyche free-coordinator --run-id taken`}},
		{"join a server that is not there", []string{"join", "--server", closed, "--key", key, "--run-id", "tiny", "--data-dir", dir, "--mdns=false"},
			[]string{"nothing listens at " + closed + " (--server)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := psyche(t, tc.args...)
			if code == 0 {
				t.Fatalf("exit 0:\n%s", errs)
			}
			// Nothing before the error: no help, no networking started.
			if out != "" {
				t.Errorf("stdout before the error:\n%s", out)
			}
			lines := strings.Split(strings.TrimRight(errs, "\n"), "\n")
			if len(lines) != 1 {
				t.Errorf("%d lines, want one:\n%s", len(lines), errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("the error lacks %q:\n%s", w, errs)
				}
			}
			for _, bad := range goInternal {
				if strings.Contains(errs, bad) {
					t.Errorf("the error has Go-internal text %q:\n%s", bad, errs)
				}
			}
		})
	}
}

// fileWriter returns a function that writes a file named name in dir with
// content and returns its path: the test cases' run files and inputs.
func fileWriter(t *testing.T, dir string) func(name, content string) string {
	return func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
}
