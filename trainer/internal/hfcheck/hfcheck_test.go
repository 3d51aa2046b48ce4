package hfcheck

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/internal/torchenv"
	"github.com/psyche-go/psyche/trainer/internal/torchref"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// tol bounds every relative error (see relErr). The models are float32
// throughout on both sides; what differs is the order of the sums (matrix
// products, softmax, norms), each term rounded to 2^-24 of its size. With
// widths of 32 to 48 and two layers the differences stay near 1e-6 of the
// logits' scale, so 1e-5 leaves room for a different BLAS without hiding a
// wrong formula, which moves the logits by a sizeable fraction of their
// scale (a wrong rotary layout, epsilon or head mapping all do).
const tol = 1e-5

// relErr is max|got - want| / max|want| over the tensor: the largest
// difference measured against the tensor's scale. An element-wise ratio is
// meaningless where a logit is near zero (a correct model can be off there
// by any multiple of the tiny value), while rounding errors scale with the
// magnitudes summed, which the tensor's largest value bounds.
func relErr(got, want []float32) float64 {
	var diff, scale float64
	for i := range want {
		diff = max(diff, math.Abs(float64(got[i])-float64(want[i])))
		scale = max(scale, math.Abs(float64(want[i])))
	}
	return diff / scale
}

// run is run.json: what hfcheck.py reads besides the tensors.
type run struct {
	torchref.Batch
	Arch string `json:"arch"`
	// Config is the model's config in the keys of the torch worker's
	// models.build (trainer/engine/torch/worker/models.py).
	Config map[string]any `json:"config"`
	// Seed seeds transformers' own model (the one it writes for us).
	Seed int `json:"seed"`
}

func specs(c modelspec.Config) []modelspec.TensorSpec {
	if c.Arch == coordinator.ArchGPT {
		return c.GPT.Specs()
	}
	return c.Llama.Specs()
}

// pass returns m's logits on bt and its mean loss of bt's targets.
func pass(t *testing.T, m runmodel.Model, bt torchref.Batch) (logits []float32, loss float32) {
	t.Helper()
	if _, err := m.Forward(bt.Inputs, nil, bt.B, bt.T); err != nil {
		t.Fatal(err)
	}
	logits = append([]float32(nil), m.Logits()...)
	loss, err := m.Forward(bt.Inputs, bt.Targets, bt.B, bt.T)
	if err != nil {
		t.Fatal(err)
	}
	return logits, loss
}

// TestModelsMatchTransformers checks, for GPT and for Llama with
// grouped-query attention and an untied head and with plain multi-head
// attention and a tied head, on random weights and one batch:
//   - the Go model's Hugging Face directory (runmodel.Save, what psyche
//     export writes) loads into transformers' AutoModelForCausalLM, whose
//     logits and loss (eager and sdpa attention) match the Go model's;
//   - the torch worker's model on the Go model's parameters matches
//     transformers too (hfcheck.py checks both and reports the errors);
//   - a model transformers built and wrote with save_pretrained loads
//     with runmodel.Load, and the Go model's logits and loss match
//     transformers'.
func TestModelsMatchTransformers(t *testing.T) {
	py := torchenv.Python(t, "transformers")
	ctx := context.Background()
	cases := []struct {
		name string
		cfg  modelspec.Config
	}{
		{"gpt2", modelspec.Config{Arch: coordinator.ArchGPT,
			GPT: modelspec.GPTConfig{Vocab: 80, Context: 16, Width: 24, Layers: 2, Heads: 3}}},
		{"llama gqa untied head", modelspec.Config{Arch: coordinator.ArchLlama,
			Llama: modelspec.LlamaConfig{Vocab: 96, Context: 16, Width: 32, Layers: 2, Heads: 4, KVHeads: 2,
				Intermediate: 48, RopeTheta: 10000}}},
		// Llama 3's θ and an ε other than the default: a loader that
		// misses either (transformers 5 writes θ inside rope_parameters)
		// moves every logit.
		{"llama mha tied head", modelspec.Config{Arch: coordinator.ArchLlama,
			Llama: modelspec.LlamaConfig{Vocab: 96, Context: 16, Width: 32, Layers: 2, Heads: 4, KVHeads: 4,
				Intermediate: 48, RopeTheta: 500000, TiedHead: true, NormEps: 1e-6}}},
	}

	// Every model's directory first, then one Python process for all.
	dirs := make([]string, len(cases))
	batches := make([]torchref.Batch, len(cases))
	for i, c := range cases {
		dirs[i] = filepath.Join(t.TempDir(), strings.ReplaceAll(c.name, " ", "_"))
		batches[i] = writeOurs(t, dirs[i], c.cfg, uint64(i+1))
	}
	cmd := exec.Command(py, append([]string{"hfcheck.py"}, dirs...)...)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("hfcheck.py: %v\n%s%s", err, stdout, stderr.String())
	}
	var report map[string]map[string]float64
	if err := json.Unmarshal(stdout, &report); err != nil {
		t.Fatalf("hfcheck.py printed %q: %v", stdout, err)
	}

	for i, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			errs := report[dirs[i]]
			if len(errs) == 0 {
				t.Fatalf("hfcheck.py reported nothing for %s", dirs[i])
			}
			// Theirs, loaded by us.
			bt := batches[i]
			vocab := c.cfg.GPT.Vocab + c.cfg.Llama.Vocab
			theirs, err := runmodel.Load(ctx, filepath.Join(dirs[i], "theirs"), nil)
			if err != nil {
				t.Fatalf("loading transformers' save_pretrained directory: %v", err)
			}
			ck, err := checkpoint.Load(filepath.Join(dirs[i], "theirs.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			wantLogits, err := ck.Tensor("logits", []int{bt.B, bt.T, vocab})
			if err != nil {
				t.Fatal(err)
			}
			wantLoss, err := ck.Tensor("loss", []int{1})
			if err != nil {
				t.Fatal(err)
			}
			gotLogits, gotLoss := pass(t, theirs, bt)
			errs["go logits of transformers' checkpoint (runmodel.Load) vs transformers"] = relErr(gotLogits, wantLogits)
			errs["go loss of transformers' checkpoint (runmodel.Load) vs transformers"] = relErr([]float32{gotLoss}, wantLoss)

			for _, k := range slices.Sorted(maps.Keys(errs)) {
				t.Logf("%-70s %.2e", k, errs[k])
				if !(errs[k] <= tol) {
					t.Errorf("%s: relative error %.3g, want <= %g", k, errs[k], tol)
				}
			}
		})
	}
}

// writeOurs builds a model of cfg with weights from seed (perturbed so
// that norm weights and biases are not 1 and 0), and writes into dir what
// hfcheck.py reads: ours/ (runmodel.Save's Hugging Face directory),
// go.safetensors (the logits and loss on a batch drawn from seed, and the
// parameters by their Specs names for the torch worker) and run.json. It
// returns the batch.
func writeOurs(t *testing.T, dir string, cfg modelspec.Config, seed uint64) torchref.Batch {
	t.Helper()
	ctx := context.Background()
	m, err := runmodel.New(cfg, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 7))
	for _, p := range m.Tensors() {
		torchref.Perturb(r, p)
	}
	if err := runmodel.Save(ctx, m, filepath.Join(dir, "ours"), true, nil); err != nil {
		t.Fatal(err)
	}
	vocab := cfg.GPT.Vocab + cfg.Llama.Vocab
	bt := torchref.NewBatch(r, 2, 12, vocab)
	logits, loss := pass(t, m, bt)
	var out torchref.Out
	out.Add("logits", []int{bt.B, bt.T, vocab}, logits)
	out.Add("loss", []int{1}, []float32{loss})
	for k, s := range specs(cfg) {
		out.Add("param."+s.Name, s.Shape, m.Tensors()[k])
	}
	arch, wc := torch.ModelConfig(cfg)
	if err := out.Write(ctx, dir, run{Batch: bt, Arch: arch, Config: wc, Seed: int(seed)}); err != nil {
		t.Fatal(err)
	}
	return bt
}
