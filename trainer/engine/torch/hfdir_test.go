package torch

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// savePretrained is what a user does before starting a run from a checkpoint
// directory: transformers itself builds a model from the config at config
// (its weights drawn from seed), saves it to dir with save_pretrained, and
// computes each sequence's mean loss on b, which the test compares with the
// engine's.
const savePretrained = `
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers
config_path, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
batch = json.load(sys.stdin)
raw = json.load(open(config_path))
config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
torch.manual_seed(seed)
model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
model.save_pretrained(out)
b, t = batch["seqs"], batch["seq_len"]
x = torch.tensor(batch["inputs"]).view(b, t)
y = torch.tensor(batch["targets"]).view(b, t)
with torch.no_grad():
    logits = model(input_ids=x, use_cache=False).logits.float()
    per_token = torch.nn.functional.cross_entropy(logits.reshape(b * t, -1), y.reshape(-1), reduction="none")
print(json.dumps(per_token.view(b, t).mean(dim=1).tolist()))
`

// saveWithTransformers runs savePretrained: the directory it wrote and
// transformers' losses on b.
func saveWithTransformers(t *testing.T, config string, seed int, b engine.Batch) (string, []float64) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "qwen3-saved")
	in, err := json.Marshal(map[string]any{"seqs": b.Seqs, "seq_len": b.SeqLen, "inputs": b.Inputs, "targets": b.Targets})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(torchPython(t), "-c", savePretrained, config, strconv.Itoa(seed), dir)
	cmd.Stdin = strings.NewReader(string(in))
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("save_pretrained: %v\n%s", err, exitStderr(err))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var losses []float64
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &losses); err != nil {
		t.Fatalf("transformers' losses %q: %v", out, err)
	}
	return dir, losses
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// runFromDir is a Transformers run whose model starts from the checkpoint
// directory dir (file://dir), its shape the directory's config.json and its
// revision the model's hash, as a run file records them.
func runFromDir(t *testing.T, dir string, context int) *coordinator.Model {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modelspec.ParseTransformersFile(data)
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.Mirror(context)
	if err != nil {
		t.Fatal(err)
	}
	m := &coordinator.Model{MaxSeqLen: uint32(context)}
	modelspec.SetTransformers(m, c)
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "file://"+dir)
	return m
}

// TestTransformersFromDirectory: a run starts from a directory that
// transformers' save_pretrained wrote. The trainer's check before joining
// accepts it; the engine opened on the directory's weights holds them
// exactly (its model's hash is the directory's) and computes on a batch the
// losses transformers computes on the same weights. A directory missing a
// tensor is refused by the check in one line naming it.
func TestTransformersFromDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts torch workers")
	}
	_, op := openers(t)
	ctx := context.Background()
	b := randomBatch(rand.New(rand.NewPCG(3, 4)), 256, 3, 32)
	dir, want := saveWithTransformers(t, exampleConfigs[0], 5, b)

	m := runFromDir(t, dir, 32)
	if err := op.CheckModel(ctx, m); err != nil {
		t.Fatalf("CheckModel on the saved directory: %v", err)
	}
	tf, err := runmodel.LoadRunTransformers(m)
	if err != nil {
		t.Fatal(err)
	}
	e := openModel(t, op, tf)
	l, err := e.Losses(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		// Eager attention in the script, SDPA in the worker: the same
		// function, summed in another order.
		if relErr(float64(l.Seqs[i]), w) > 1e-4 {
			t.Fatalf("sequence %d: the engine's loss %v, transformers' %v", i, l.Seqs[i], w)
		}
	}
	held, err := hostModel(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	if runmodel.Revision(held) != runmodel.Revision(tf) {
		t.Fatalf("the engine holds a model of hash %s, the directory's is %s", runmodel.Revision(held), runmodel.Revision(tf))
	}

	// The same directory without one layer's up projection.
	const dropped = "model.layers.1.mlp.up_proj.weight"
	broken := filepath.Join(t.TempDir(), "broken")
	if err := os.MkdirAll(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	var kept []checkpoint.Tensor
	for _, ct := range tf.CheckpointTensors() {
		if ct.Name != dropped {
			kept = append(kept, ct)
		}
	}
	if err := os.WriteFile(filepath.Join(broken, "config.json"), tf.JSON, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.Save(ctx, filepath.Join(broken, "model.safetensors"), kept, nil); err != nil {
		t.Fatal(err)
	}
	err = op.CheckModel(ctx, runFromDir(t, broken, 32))
	if err == nil || !strings.Contains(err.Error(), "has no tensor "+dropped+" [176 64]") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("CheckModel on a directory without %s: %v; want one line naming it", dropped, err)
	}
}

// TestTransformersTooBig: a trainer refuses, in one line before it joins, a
// config whose training state does not fit: the device's memory (on the CPU
// the machine's RAM), or the bound WithMemory sets. The check describes the
// model on the meta device: a config of trillions of parameters is refused
// without being allocated.
func TestTransformersTooBig(t *testing.T) {
	if testing.Short() {
		t.Skip("starts torch workers")
	}
	_, op := openers(t)
	ctx := context.Background()
	data, err := os.ReadFile(exampleConfigs[0])
	if err != nil {
		t.Fatal(err)
	}
	// A vocabulary of 2^24 tokens of width 2^16: an embedding of 2^40
	// parameters, 20 TiB of training state.
	huge := strings.NewReplacer(`"vocab_size": 256`, `"vocab_size": 16777216`, `"hidden_size": 64`, `"hidden_size": 65536`,
		`"head_dim": 16`, `"head_dim": 16384`).Replace(string(data))
	if huge == string(data) {
		t.Fatal("the example's fields moved: the test edits none")
	}
	path := filepath.Join(t.TempDir(), "huge.json")
	if err := os.WriteFile(path, []byte(huge), 0o644); err != nil {
		t.Fatal(err)
	}
	oneLine := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line with %q", what, err, want)
		}
	}
	oneLine("huge config", op.CheckModel(ctx, runWithConfig(t, path)), "to train on cpu, which has ")

	bounded, err := New(WithMemory(1 << 20))
	if err != nil {
		t.Fatal(err)
	}
	oneLine("the example under a 1 MiB bound", bounded.CheckModel(ctx, runWithConfig(t, exampleConfigs[0])),
		"need at least 2.1 MiB to train on cpu, where this trainer may use 1.0 MiB")
}
