package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// transformersExamples are the shipped transformers run files, one per
// family, the class from_pretrained must build from their checkpoints, the
// epochs the test trains (two: the second starts from the checkpoint
// directory the first recorded), how each trainer holds the model (the
// log line that must say so), and whether the run starts from a directory
// that transformers' save_pretrained wrote (fromDir) instead of the file's
// seed. The Qwen3 example runs twice: from its seed with each trainer over
// two CPU ranks sharded by FSDP2, and from a directory on one device.
var transformersExamples = []struct {
	name, file, class string
	epochs            int
	devices           []string
	log               string
	fromDir           bool
}{
	{"qwen3-sharded", "examples/qwen3-tiny-run.toml", "Qwen3ForCausalLM", 1, []string{"--devices", "cpu,cpu", "--placement", "shard"},
		"sharded (FSDP2) over 2 ranks: each device holds 1/2 of every parameter", false},
	{"qwen3-from-directory", "examples/qwen3-tiny-run.toml", "Qwen3ForCausalLM", 1, nil, "", true},
	{"gemma3", "examples/gemma3-tiny-run.toml", "Gemma3ForCausalLM", 2, nil, "", false},
}

const zeroNormDir = `
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers
raw = json.load(open(sys.argv[1]))
config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
torch.manual_seed(5)
model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
with torch.no_grad():
    model.model.norm.weight.zero_()
model.save_pretrained(sys.argv[2])
`

// runFromDir writes a copy of the run file example whose model starts from
// a directory save_pretrained wrote (zeroNormDir), and returns its path.
func runFromDir(t *testing.T, example string) string {
	t.Helper()
	src, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	hf := regexp.MustCompile(`(?m)^hf_config = "([^"]+)".*$`).FindSubmatch(src)
	if hf == nil || !bytes.Contains(src, []byte(`url = "seed:1"`)) {
		t.Fatalf("%s names no hf_config or no seed:1", example)
	}
	// The python localnet's torch engine will run (the engine's check
	// names it).
	info := torchInfo(t)
	dir := filepath.Join(t.TempDir(), "saved")
	py := exec.Command(info.Python, "-c", zeroNormDir, string(hf[1]), dir)
	py.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
	if out, err := py.CombinedOutput(); err != nil {
		t.Fatalf("save_pretrained: %v\n%s", err, out)
	}
	text := bytes.Replace(bytes.Replace(src, hf[0], nil, 1), []byte(`url = "seed:1"`), []byte(`url = "file://`+dir+`"`), 1)
	path := filepath.Join(t.TempDir(), "run.toml")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// enginePythonRE reads the interpreter from the engine line localnet prints.
var enginePythonRE = regexp.MustCompile(`engine: torch \S+ \((\S+)\) on `)

// TestLocalnetTrainsTransformers runs each shipped transformers example the
// way a user would (from the repository's root, localnet --engine torch;
// the Qwen3 one with each trainer over two CPU ranks, sharded by FSDP2):
// the held-out loss falls, every trainer ends with the same weights, and
// the checkpoint is a Hugging Face directory that the same python's
// AutoModelForCausalLM.from_pretrained loads and generates from. The Qwen3
// run starts from a directory transformers saved (its model's loss
// exactly ln 256 at the start: the trainers hold the directory's weights).
func TestLocalnetTrainsTransformers(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	if raceEnabled {
		t.Skip("torch trainers: the race detector only slows the Go side's waiting (TestLocalnetEngines covers the node under -race)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root) // the examples name their config.json relative to the root
	for _, ex := range transformersExamples {
		t.Run(ex.name, func(t *testing.T) {
			file := ex.file
			if ex.fromDir {
				file = runFromDir(t, ex.file)
			}
			var out, errb bytes.Buffer
			args := append([]string{"psyche", "--log-level", "debug", "localnet", "--engine", "torch", "--run", file, "--virtual-time",
				"--trainers", "3", "--epochs", strconv.Itoa(ex.epochs), "--epoch-time", "6", "--explorer-addr", "", "--dir", t.TempDir()},
				ex.devices...)
			code := run(args, &out, &errb)
			got := out.String()
			t.Log("\n" + got)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, tail(errb.String(), 150))
			}
			if !strings.Contains(errb.String(), ex.log) {
				t.Errorf("the log lacks %q", ex.log)
			}
			for _, want := range []string{"-parameter transformers", "trainers hold identical weights: true (torch: 3 trainers", "checkpoint: "} {
				if !strings.Contains(got, want) {
					t.Errorf("output lacks %q", want)
				}
			}
			before, after := summaryLoss(t, got)
			switch {
			case ex.fromDir:
				// All-zero logits: the loss is ln 256 = 5.5452 on any
				// text. From there the final norm grows from zero by
				// sign steps, the loss falling slowly: what is checked
				// is where it started.
				if !strings.Contains(got, "held-out loss: 5.545 -> ") {
					t.Errorf("held-out loss %.3f -> %.3f: the trainers did not start from the saved directory (its loss is 5.545)", before, after)
				}
			case before < 5 || before > 6.5 || after >= before-0.2:
				// A fresh model's loss is about ln 256 = 5.5; 8 steps take
				// off about 0.5 (Gemma 3 in two epochs 5.537 -> 4.450 when
				// written).
				t.Errorf("held-out loss %.3f -> %.3f: not a fresh model that got better", before, after)
			}
			py := enginePythonRE.FindStringSubmatch(got)
			if py == nil {
				t.Fatal("no engine line naming the python")
			}
			ck := strings.Fields(got[strings.Index(got, "checkpoint: "):])[1]
			gen := exec.Command(py[1], "-c", `
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
x = torch.tensor([list(b"The light of")])
y = m.generate(x, max_new_tokens=4, do_sample=False)
print(type(m).__name__, y.shape[1] - x.shape[1])
`, ck)
			gen.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
			o, err := gen.Output()
			if err != nil {
				t.Fatalf("from_pretrained(%s): %v\n%s", ck, err, exitStderr(err))
			}
			if want := ex.class + " 4"; strings.TrimSpace(lastLine(string(o))) != want {
				t.Fatalf("from_pretrained and generate printed %q, want %q", o, want)
			}
		})
	}
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return tail(string(ee.Stderr), 20)
	}
	return ""
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestLocalnetTransformersNeedsTorch: a transformers run on the Go engine
// is refused in one line, before anything starts, saying what to use.
func TestLocalnetTransformersNeedsTorch(t *testing.T) {
	t.Chdir("../..")
	for _, engines := range []string{"go", "go,torch"} {
		var out, errb bytes.Buffer
		code := run([]string{"psyche", "localnet", "--engine", engines, "--trainers", "3", "--run", transformersExamples[0].file,
			"--dir", t.TempDir()}, &out, &errb)
		msg := strings.TrimSpace(errb.String())
		if code == 0 || !strings.Contains(msg, "use --engine torch") || strings.Contains(msg, "\n") {
			t.Fatalf("--engine %s: exit %d, %q; want one line saying to use --engine torch", engines, code, msg)
		}
	}
}

// TestLocalnetTransformersTooBig: localnet checks, before it draws the
// model or starts anything else, what each trainer checks before joining: a
// model whose training state exceeds --device-memory is refused in one
// line naming both sizes and what to do.
func TestLocalnetTransformersTooBig(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a torch worker")
	}
	t.Chdir("../..")
	var out, errb bytes.Buffer
	code := run([]string{"psyche", "localnet", "--engine", "torch", "--device-memory", "1MiB", "--trainers", "3",
		"--run", transformersExamples[0].file, "--explorer-addr", "", "--dir", t.TempDir()}, &out, &errb)
	msg := strings.TrimSpace(errb.String())
	want := "need at least 2.1 MiB to train on cpu, where this trainer may use 1.0 MiB: use a smaller config or a larger bound (--device-memory)"
	if code == 0 || !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
		t.Fatalf("exit %d, %q; want one line with %q", code, msg, want)
	}
	// The engine line (python and torch are there), and nothing after it.
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "engine: torch") {
		t.Fatalf("localnet went on after the refusal: %s", out.String())
	}
}

// TestRunFileTransformers: a transformers run file's model is completed from
// its hf_config (the shape fields, the source naming the config, its hash
// as revision), and every misuse is refused naming the key.
func TestRunFileTransformers(t *testing.T) {
	t.Chdir("../..")
	const example = "examples/qwen3-tiny-run.toml"
	u, err := loadRunFile(example)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("examples/hf/qwen3-tiny.json")
	if err != nil {
		t.Fatal(err)
	}
	m := u.Model
	if m.Architecture != coordinator.ArchTransformers || m.VocabSize != 256 || m.DModel != 64 || m.NLayers != 2 || m.NHeads != 4 ||
		coordinator.FixedString(m.Checkpoint.Source.URL[:]) != "seed:1@examples/hf/qwen3-tiny.json" ||
		coordinator.FixedString(m.Checkpoint.Source.Revision[:]) != modelspec.ConfigHash(data) {
		t.Fatalf("model: arch %v, vocab %d, d_model %d, n_layers %d, n_heads %d, url %q, revision %q", m.Architecture, m.VocabSize,
			m.DModel, m.NLayers, m.NHeads, coordinator.FixedString(m.Checkpoint.Source.URL[:]), coordinator.FixedString(m.Checkpoint.Source.Revision[:]))
	}
	src, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"model_type":"qwen3","vocab_size":256}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		old, new string
		want     []string
	}{
		{`architecture = "transformers"`, `architecture = "llama"`, []string{`model.hf_config is for architecture = "transformers"`}},
		{`hf_config = "examples/hf/qwen3-tiny.json"`, ``, []string{"model.hf_config: architecture = \"transformers\" needs the model's config.json"}},
		{`hf_config = "examples/hf/qwen3-tiny.json"`, `hf_config = "examples/hf/none.json"`, []string{"model.hf_config: open examples/hf/none.json"}},
		{`hf_config = "examples/hf/qwen3-tiny.json"`, `hf_config = "` + bad + `"`, []string{"hidden_size or n_embd or d_model is missing"}},
		{`max_seq_len = 64 `, `max_seq_len = 256 `, []string{"max_seq_len 256 exceeds the config's 128 positions"}},
		{`max_seq_len = 64 `, "d_model = 64\nmax_seq_len = 64 ", []string{"come from the model's config.json: leave them out"}},
		{`max_seq_len = 64 `, "vocab_size = 512\nmax_seq_len = 64 ", []string{"model.vocab_size = 512, but examples/hf/qwen3-tiny.json has vocab_size 256"}},
		{`url = "seed:1"`, `url = "file:///m.safetensors"`, []string{`model.checkpoint.url = "file:///m.safetensors": a transformers run's checkpoint directory holds config.json and model.safetensors`}},
		{`url = "seed:1"`, `url = "https://example.com/m"`, []string{"a transformers run starts from seed:N (its weights drawn from the config) or from a checkpoint directory, file:///DIR"}},
		{`url = "seed:1"`, "url = \"seed:1\"\nrevision = \"00000000000000000000000000000000\"", []string{"hashes to " + modelspec.ConfigHash(data)}},
	} {
		if !strings.Contains(string(src), tt.old) {
			t.Fatalf("%s lacks %q", example, tt.old)
		}
		path := filepath.Join(dir, "run.toml")
		if err := os.WriteFile(path, []byte(strings.Replace(string(src), tt.old, tt.new, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := loadRunFile(path)
		for _, w := range tt.want {
			if err == nil || !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%q -> %q: %v; want one line with %q", tt.old, tt.new, err, w)
			}
		}
	}
}

// TestRunFileTransformersFromDirectory: a run file starts a transformers
// run from a Hugging Face checkpoint directory (url = "file://DIR"): the
// shape comes from DIR's config.json, the url stays, and the revision is
// the hash of that config and the weights, which every trainer checks.
// Each misuse is refused in one line naming the key and what to do.
func TestRunFileTransformersFromDirectory(t *testing.T) {
	t.Chdir("../..")
	const example = "examples/qwen3-tiny-run.toml"
	src, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile("examples/hf/qwen3-tiny.json")
	if err != nil {
		t.Fatal(err)
	}
	tf, err := runmodel.NewTransformers(cfg, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Tensors of any names: the run file reads the directory as psyche's
	// checkpoints hold it; the trainers check the names against
	// transformers' (the torch engine's TestTransformersFromDirectory).
	tf, err = tf.WithTensors([]string{"model.embed_tokens.weight", "model.norm.weight"}, [][]int{{256, 64}, {64}},
		[][]float32{make([]float32, 256*64), make([]float32, 64)})
	if err != nil {
		t.Fatal(err)
	}
	tf.Tensors()[1][3] = 1
	dir := filepath.Join(t.TempDir(), "saved")
	if err := tf.Save(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	fromDir := strings.Replace(strings.Replace(string(src), `hf_config = "examples/hf/qwen3-tiny.json"`, "", 1),
		`url = "seed:1"`, `url = "file://`+dir+`"`, 1)
	write := func(text string) string {
		path := filepath.Join(t.TempDir(), "run.toml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	u, err := loadRunFile(write(fromDir))
	if err != nil {
		t.Fatal(err)
	}
	m := u.Model
	if m.Architecture != coordinator.ArchTransformers || m.VocabSize != 256 || m.DModel != 64 || m.NLayers != 2 ||
		coordinator.FixedString(m.Checkpoint.Source.URL[:]) != "file://"+dir ||
		coordinator.FixedString(m.Checkpoint.Source.Revision[:]) != runmodel.Revision(tf) {
		t.Fatalf("model: arch %v, vocab %d, d_model %d, n_layers %d, url %q, revision %q (want %s)", m.Architecture, m.VocabSize,
			m.DModel, m.NLayers, coordinator.FixedString(m.Checkpoint.Source.URL[:]), coordinator.FixedString(m.Checkpoint.Source.Revision[:]),
			runmodel.Revision(tf))
	}
	// An hf_config that is the directory's config.json (byte for byte)
	// is the same run.
	if u, err := loadRunFile(write(strings.Replace(fromDir, `architecture = "transformers"`,
		"architecture = \"transformers\"\nhf_config = \"examples/hf/qwen3-tiny.json\"", 1))); err != nil ||
		coordinator.FixedString(u.Model.Checkpoint.Source.Revision[:]) != runmodel.Revision(tf) {
		t.Fatalf("hf_config naming the directory's config: %v", err)
	}
	// The same weights under a config that differs in a field the run's
	// shape does not hold: another model, another revision.
	other := filepath.Join(t.TempDir(), "other")
	edited, err := runmodel.NewTransformers([]byte(strings.Replace(string(cfg), `"rms_norm_eps": 1e-06`, `"rms_norm_eps": 1e-05`, 1)), 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	if edited, err = edited.WithTensors(tf.Names(), tf.Shapes(), tf.Tensors()); err != nil {
		t.Fatal(err)
	}
	if err := edited.Save(t.Context(), other, nil); err != nil {
		t.Fatal(err)
	}
	if u, err := loadRunFile(write(strings.Replace(fromDir, dir, other, 1))); err != nil ||
		coordinator.FixedString(u.Model.Checkpoint.Source.Revision[:]) == runmodel.Revision(tf) {
		t.Fatalf("a directory with another config.json: %v; its revision must differ from %s", err, runmodel.Revision(tf))
	}

	sharded := filepath.Join(t.TempDir(), "sharded")
	if err := os.MkdirAll(sharded, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"config.json": string(cfg), "model.safetensors.index.json": "{}"} {
		if err := os.WriteFile(filepath.Join(sharded, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		old, new string
		want     string
	}{
		{`architecture = "transformers"`, "architecture = \"transformers\"\nhf_config = \"examples/hf/gemma3-tiny.json\"",
			"model.hf_config examples/hf/gemma3-tiny.json is not " + filepath.Join(dir, "config.json") + ", the config of the checkpoint directory"},
		{`url = "file://` + dir + `"`, "url = \"file://" + dir + "\"\nrevision = \"00000000000000000000000000000000\"",
			"model.checkpoint.revision = \"00000000000000000000000000000000\", but the model in " + dir + " hashes to " + runmodel.Revision(tf)},
		{dir, sharded, "holds its weights in shards (model.safetensors.index.json), which psyche does not read: save it as one file"},
		{dir, dir + "-none", "a transformers run's checkpoint directory holds config.json and model.safetensors"},
		{`max_seq_len = 64 `, "n_layers = 2\nmax_seq_len = 64 ", "come from the model's config.json: leave them out"},
	} {
		if !strings.Contains(fromDir, tt.old) {
			t.Fatalf("the run file lacks %q", tt.old)
		}
		_, err := loadRunFile(write(strings.Replace(fromDir, tt.old, tt.new, 1)))
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q -> %q: %v; want one line with %q", tt.old, tt.new, err, tt.want)
		}
	}
}

// torchInfo is what the torch engine found of the python it runs on.
func torchInfo(t *testing.T) torch.Info {
	t.Helper()
	op, err := torch.New()
	if err != nil {
		t.Fatal(err)
	}
	info, err := op.Check(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info
}
