package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/memwatch"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
)

var tinyRun = filepath.Join("..", "..", "examples", "tiny-run.toml")

// printedLine is the value of the `key = "value"` line init-model printed.
func printedLine(t *testing.T, out, key string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, key+` = "`); ok && strings.HasSuffix(v, `"`) {
			return strings.TrimSuffix(v, `"`)
		}
	}
	t.Fatalf("no %s line in:\n%s", key, out)
	return ""
}

func TestInitModelWritesTheSeededModel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "models", "init.safetensors") // the directory is made
	out, errs, code := psyche(t, "init-model", "--config", tinyRun, "--seed", "5", "--out", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	m, err := gpt.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := gpt.New(gpt.Config{Vocab: 256, Context: 64, Width: 64, Layers: 2, Heads: 4}, 5, nil)
	if m.Config != want.Config || !slices.Equal(m.Params, want.Params) {
		t.Fatal("the file is not the run's model drawn from seed 5")
	}
	if rev := printedLine(t, out, "revision"); rev != runmodel.Revision(m) {
		t.Errorf("printed revision %s, the file's model hashes to %s", rev, runmodel.Revision(m))
	}
	if url := printedLine(t, out, "url"); url != "file://"+path {
		t.Errorf("printed url %q", url)
	}
	for _, want := range []string{"model: 120576 parameters, weights drawn from seed:5", "wrote " + path,
		// The example records seed 1's hash: seed 5's model would be refused.
		"note: " + tinyRun + ` records revision "`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// Without --out the seed defaults to the run's seed:N, and the hash is the
// one the example records.
func TestInitModelPrintsTheRunsHash(t *testing.T) {
	out, errs, code := psyche(t, "init-model", "--config", tinyRun)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	u, err := loadRunFile(tinyRun)
	if err != nil {
		t.Fatal(err)
	}
	recorded := coordinator.FixedString(u.Model.Checkpoint.Source.Revision[:])
	if rev := printedLine(t, out, "revision"); rev != recorded {
		t.Errorf("printed revision %s, the example records %s", rev, recorded)
	}
	if url := printedLine(t, out, "url"); url != "seed:1" || strings.Contains(out, "wrote") || strings.Contains(out, "note:") {
		t.Errorf("output:\n%s", out)
	}
}

func TestInitModelRejects(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	tiny, err := os.ReadFile(tinyRun)
	if err != nil {
		t.Fatal(err)
	}
	fromFile := write("file.toml", strings.Replace(string(tiny), `url = "seed:1"`, `url = "file:///var/lib/init.safetensors"`, 1))
	noModel := write("nomodel.toml", "[metadata]\nname = \"x\"\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no --config", nil, `Required flag "config" not set`},
		{"a missing run file", []string{"--config", filepath.Join(dir, "none.toml")}, "none.toml: no such file"},
		{"no [model]", []string{"--config", noModel}, "nomodel.toml has no [model] section: init-model builds the model it describes"},
		{"no seed", []string{"--config", fromFile}, `--seed is needed: ` + fromFile + `'s checkpoint url is "file:///var/lib/init.safetensors", not seed:N`},
		{"a bad seed", []string{"--config", tinyRun, "--seed", "-1"}, `--seed "-1": want a whole number of 0 or more`},
	} {
		out, errs, code := psyche(t, append([]string{"init-model"}, tc.args...)...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("%s: exit %d, %q, want %q\n%s", tc.name, code, errs, tc.want, out)
		}
	}
	// With a seed given, a run that loads from a file is fine.
	if out, errs, code := psyche(t, "init-model", "--config", fromFile, "--seed", "1"); code != 0 || !strings.Contains(out, "revision = ") {
		t.Errorf("--seed with a file:// run: exit %d %s %s", code, out, errs)
	}
}

// A Llama's --out directory is a Hugging Face checkpoint of the model whose
// revision the command prints.
func TestInitModelWritesHFDirectory(t *testing.T) {
	out := filepath.Join(t.TempDir(), "hf")
	stdout, errs, code := psyche(t, "init-model", "--config", filepath.Join("..", "..", "examples", "llama-bytes-run.toml"), "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	m, err := runmodel.Load(context.Background(), out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rev := printedLine(t, stdout, "revision"); rev != runmodel.Revision(m) {
		t.Fatalf("printed revision %s, the directory's model hashes to %s", rev, runmodel.Revision(m))
	}
	cfg, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil || !strings.Contains(string(cfg), `"rms_norm_eps": 0.00001,`) {
		t.Fatalf("config.json: %s %v", cfg, err)
	}
}

// The tiny and byte Llama examples say they need no files: each revision is
// the hash of the model seed:N draws for its [model], so trainers accept it,
// and its data opens at its token size and sequence length. The Llama 3
// example's revision and size are true too; its data is the file its
// comments say how to make (TestLocalnetTrainsLlama3 makes and trains on it).
func TestTinyRunExampleIsTrue(t *testing.T) {
	for _, path := range []string{tinyRun, filepath.Join("..", "..", "examples", "llama-bytes-run.toml")} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			u := checkSeedExample(t, path)
			p, err := data.Open(context.Background(), coordinator.FixedString(u.Model.DataLocation[:]), int(u.Model.TokenSize), int(u.Model.MaxSeqLen))
			if err != nil {
				t.Fatalf("the example's data: %v", err)
			}
			p.Close()
		})
	}
	t.Run("llama-run.toml", func(t *testing.T) {
		u := checkSeedExample(t, filepath.Join("..", "..", "examples", "llama-run.toml"))
		if u.Model.VocabSize != 128256 || u.Metadata.VocabSize != 128256 || u.Model.TokenSize != 4 {
			t.Errorf("vocab_size %d (metadata %d), token_size %d: not Llama 3's", u.Model.VocabSize, u.Metadata.VocabSize, u.Model.TokenSize)
		}
	})
}

// checkSeedExample checks the example's revision and num_parameters
// against the model its seed:N draws, and returns the example.
func checkSeedExample(t *testing.T, path string) *coordinator.Update {
	u, err := loadRunFile(path)
	if err != nil {
		t.Fatal(err)
	}
	url := coordinator.FixedString(u.Model.Checkpoint.Source.URL[:])
	src, err := modelspec.ParseSource(url)
	if err != nil || src.Kind != modelspec.FromSeed {
		t.Fatalf("the example's url %q is not seed:N (%v)", url, err)
	}
	m, err := runmodel.Init(u.Model, src.Seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	rev := coordinator.FixedString(u.Model.Checkpoint.Source.Revision[:])
	if !weights.IsHash(rev) || rev != runmodel.Revision(m) {
		t.Fatalf("%s records revision %q; the model of %s hashes to %s", path, rev, url, runmodel.Revision(m))
	}
	if got, want := m.NumParams(), int(u.Metadata.NumParameters); got != want {
		t.Errorf("metadata.num_parameters is %d, the model has %d", want, got)
	}
	return u
}

// TestInitModelDrawsTransformers: for a Hugging Face run, init-model without
// --out prints the config's hash (a seed:N run's revision) and draws
// nothing; with --out it writes the model every trainer draws from the
// seed (the torch engine's draw) as a directory that a trainer then loads
// from url = "file://DIR" with the printed revision, and that transformers'
// from_pretrained loads.
func TestInitModelDrawsTransformers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a torch worker")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root) // the example names its config.json relative to the root
	run := "examples/qwen3-tiny-run.toml"
	out, errs, code := psyche(t, "init-model", "--config", run, "--seed", "5")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	u, err := loadRunFile(run)
	if err != nil {
		t.Fatal(err)
	}
	seeded, _, err := runmodel.RunTransformersConfig(u.Model)
	if err != nil {
		t.Fatal(err)
	}
	if rev := printedLine(t, out, "revision"); rev != modelspec.ConfigHash(seeded.JSON) {
		t.Errorf("without --out: revision %s, the config hashes to %s", rev, modelspec.ConfigHash(seeded.JSON))
	}
	if url := printedLine(t, out, "url"); url != "seed:5" {
		t.Errorf("without --out: url %q", url)
	}

	dir := filepath.Join(t.TempDir(), "qwen3")
	out, errs, code = psyche(t, "init-model", "--config", run, "--seed", "5", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	url, rev := printedLine(t, out, "url"), printedLine(t, out, "revision")
	if url != "file://"+dir {
		t.Fatalf("printed url %q", url)
	}
	// What a trainer of a run starting from that directory loads and
	// checks against the printed revision.
	var m coordinator.Model = *u.Model
	copy(m.Checkpoint.Source.URL[:], make([]byte, len(m.Checkpoint.Source.URL)))
	copy(m.Checkpoint.Source.URL[:], url)
	loaded, err := runmodel.LoadRunTransformers(&m)
	if err != nil {
		t.Fatal(err)
	}
	if err := runmodel.CheckRevision(loaded, url, rev); err != nil {
		t.Fatalf("a trainer loading %s: %v", url, err)
	}
	// The weights are seed 5's, as every trainer of a seed:5 run draws them.
	seeded.Seed = 5
	drawn, err := drawTransformers(t.Context(), seeded)
	if err != nil {
		t.Fatal(err)
	}
	// By name: the file keeps its tensors in its own order.
	written := map[string][]float32{}
	for _, ct := range loaded.CheckpointTensors() {
		written[ct.Name] = ct.Data
	}
	want := drawn.CheckpointTensors()
	if len(written) != len(want) || len(want) == 0 {
		t.Fatalf("%d tensors written, %d drawn", len(written), len(want))
	}
	for _, ct := range want {
		if !slices.Equal(written[ct.Name], ct.Data) {
			t.Fatalf("tensor %s differs from seed 5's draw", ct.Name)
		}
	}
	info := torchInfo(t)
	py := exec.Command(info.Python, "-c", `
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import transformers
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
print(type(m).__name__, sum(p.numel() for p in m.parameters()))
`, dir)
	py.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
	o, err := py.Output()
	if err != nil {
		t.Fatalf("from_pretrained(%s): %v\n%s", dir, err, exitStderr(err))
	}
	if got := strings.TrimSpace(lastLine(string(o))); got != "Qwen3ForCausalLM 108928" {
		t.Errorf("from_pretrained built %q", got)
	}
	if !strings.Contains(out, "model: 108928 parameters, weights drawn from seed:5") {
		t.Errorf("output:\n%s", out)
	}
}

// TestInitModelStreams: init-model draws, hashes and writes a model a range
// at a time, never holding it whole: for a Llama of about 20M parameters
// (79 MB of float32), written as a Hugging Face directory and as one
// safetensors file, the Go heap's peak stays under a third of the model,
// and what it wrote is the seeded model (its hash is the printed revision).
func TestInitModelStreams(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "llama-1b-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for key, v := range map[string]string{"vocab_size": "4096", "d_model": "512", "n_layers": "6", "n_heads": "8",
		"n_kv_heads": "4", "intermediate_size": "1408", "max_seq_len": "64", "token_size": "2"} {
		text = regexp.MustCompile(`(?m)^`+key+` = \S+`).ReplaceAllString(text, key+" = "+v)
	}
	run := filepath.Join(t.TempDir(), "run.toml")
	if err := os.WriteFile(run, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := loadRunFile(run)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := modelspec.ModelConfig(u.Model)
	if err != nil {
		t.Fatal(err)
	}
	want, err := runmodel.New(cfg, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	modelBytes := 4 * float64(cfg.NumParams())
	if modelBytes < 60e6 {
		t.Fatalf("the test's model is %.0f bytes: too small to tell a chunk from the whole", modelBytes)
	}
	for _, out := range []string{"dir", "model.safetensors"} {
		path := filepath.Join(t.TempDir(), out)
		var stdout, errs string
		var code int
		peak, err := memwatch.HeapPeak(func() error {
			stdout, errs, code = psyche(t, "init-model", "--config", run, "--seed", "3", "--out", path)
			return nil
		})
		if err != nil || code != 0 {
			t.Fatalf("%s: exit %d (%v): %s", out, code, err, errs)
		}
		if peak > modelBytes/3 {
			t.Errorf("%s: the Go heap peaked %.1f MB above its start writing a %.1f MB model: it held the model",
				out, peak/1e6, modelBytes/1e6)
		}
		if rev := printedLine(t, stdout, "revision"); rev != runmodel.Revision(want) {
			t.Errorf("%s: printed revision %s, the seeded model's is %s", out, rev, runmodel.Revision(want))
		}
		t.Logf("%s: heap peak %.1f MB for a %.1f MB model", out, peak/1e6, modelBytes/1e6)
		got, err := runmodel.Load(context.Background(), path, nil)
		if err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if got.Hash() != want.Hash() {
			t.Errorf("%s: the written model is not the one drawn from seed 3", out)
		}
	}
}
