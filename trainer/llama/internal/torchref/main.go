// Command torchref writes what scripts/check-torch compares with PyTorch:
// a small Llama with random weights as a Hugging Face directory (config.json
// and model.safetensors), a batch, and what the Go model computes from them
// (logits, loss, every parameter's gradient, the parameters after one AdamW
// step and after one DisTrO step), as safetensors with Hugging Face names.
// trainer/internal/torchref describes the files.
//
//	go run ./trainer/llama/internal/torchref -dir DIR [-kv 2] [-tied]
//
// The DisTrO step runs on the model's own (fused, layer-stacked) tensors,
// so for it the file also holds those tensors by their storage names, with
// the gradients the step used: the reference repeats the step from the same
// inputs, which checks the optimizer rather than the gradients again.
package main

import (
	"context"
	"flag"
	"math/rand/v2"
	"path/filepath"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/internal/torchref"
	"github.com/psyche-go/psyche/trainer/llama"
)

// The steps' hyper-parameters, also written to run.json for the reference.
type run struct {
	torchref.Batch
	LR                   float32
	Beta1, Beta2, Eps    float32
	WeightDecay, Clip    float32
	Chunk, TopK          int
	Decay                float32
	DistroSpecs          []string
	DistroShapes         [][]int
	NormEps              float32
	HeadTied, GQA        bool
	RopeTheta            float32
	Vocab, Width, Layers int
}

func main() {
	kv := flag.Int("kv", 2, "key/value heads (of 4 query heads)")
	tied := flag.Bool("tied", false, "tie the output head to the embeddings")
	seed := flag.Uint64("seed", 1, "weights and batch seed")
	torchref.Main(func(ctx context.Context, dir string) error { return write(ctx, dir, *kv, *tied, *seed) })
}

func write(ctx context.Context, dir string, kv int, tied bool, seed uint64) error {
	cfg := llama.Config{Vocab: 96, Context: 16, Width: 32, Layers: 2, Heads: 4, KVHeads: kv, Intermediate: 48,
		RopeTheta: 10000, TiedHead: tied}
	m, err := llama.New(cfg, seed, nil)
	if err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(seed, 99))
	torchref.Perturb(r, m.Params)
	if err := m.SaveHF(ctx, filepath.Join(dir, "model"), llama.HFOptions{}); err != nil {
		return err
	}
	rn := run{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1,
		Chunk: 8, TopK: 5, Decay: 0.999, NormEps: llama.DefaultNormEps, HeadTied: tied, GQA: kv < cfg.Heads,
		RopeTheta: cfg.RopeTheta, Vocab: cfg.Vocab, Width: cfg.Width, Layers: cfg.Layers}
	rn.Batch = torchref.NewBatch(r, 2, 12, cfg.Vocab)
	var out torchref.Out
	add := out.Add
	if err := out.Pass(m, rn.Batch, cfg.Vocab); err != nil {
		return err
	}

	// One AdamW step from these gradients.
	start := append([]float32(nil), m.Params...)
	var sizes []int
	for _, t := range m.Tensors() {
		sizes = append(sizes, len(t))
	}
	adam := distro.NewAdamW(sizes, rn.Beta1, rn.Beta2, rn.Eps, rn.WeightDecay)
	adam.ClipGradNorm = rn.Clip
	if err := adam.Step(m.Tensors(), m.GradTensors(), rn.LR); err != nil {
		return err
	}
	for _, p := range m.CheckpointTensors() {
		add("adamw."+p.Name, p.Shape, p.Data)
	}
	copy(m.Params, start)

	// One DisTrO step (one trainer, the mean aggregation, float values),
	// on the storage tensors, from the gradient of a batch holding every
	// token: an embedding row no token reads has a zero gradient, and a
	// tile with one non-zero row has DCT coefficients equal in magnitude up
	// to rounding, where the top-k choice would depend on the last bit of
	// the transform rather than on the optimizer.
	all := r.Perm(cfg.Vocab)
	in2, tg2 := make([]uint32, cfg.Vocab), make([]uint32, cfg.Vocab)
	for i, tok := range all {
		in2[i], tg2[i] = uint32(tok), uint32(r.IntN(cfg.Vocab))
	}
	if _, err := m.Forward(in2, tg2, cfg.Vocab/rn.T, rn.T); err != nil {
		return err
	}
	m.ZeroGrad()
	if err := m.Backward(); err != nil {
		return err
	}
	opt, err := distro.NewDeMo(m.Shapes(), distro.Options{Chunk: rn.Chunk, TopK: rn.TopK, Decay: rn.Decay,
		WeightDecay: rn.WeightDecay, ClipGradNorm: rn.Clip, Aggregation: distro.AggregateMean, Workers: 1})
	if err != nil {
		return err
	}
	distroStart := append([]float32(nil), m.Params...)
	g1 := make([][]float32, len(m.GradTensors()))
	for i, g := range m.GradTensors() {
		g1[i] = append([]float32(nil), g...)
	}
	for i, s := range cfg.Specs() {
		rn.DistroSpecs = append(rn.DistroSpecs, s.Name)
		rn.DistroShapes = append(rn.DistroShapes, s.Shape)
		add("distro.param."+s.Name, s.Shape, m.Tensors()[i])
		add("distro.grad."+s.Name, s.Shape, m.GradTensors()[i])
	}
	frame, err := opt.Step(m.GradTensors(), rn.LR)
	if err != nil {
		return err
	}
	if err := opt.Apply(m.Tensors(), []*distro.Frame{frame}, rn.LR); err != nil {
		return err
	}
	for i, s := range cfg.Specs() {
		add("distro.after."+s.Name, s.Shape, m.Tensors()[i])
	}

	// Two steps of DisTrO with normalized gradients (the run default): the
	// first from the gradient above, the second from the same tokens with
	// other targets; only the second result is applied, to the starting
	// parameters, so the first step's running squares and residual are
	// what is checked.
	nopt, err := distro.NewDeMo(m.Shapes(), distro.Options{Chunk: rn.Chunk, TopK: rn.TopK, Decay: rn.Decay,
		WeightDecay: rn.WeightDecay, ClipGradNorm: rn.Clip, Aggregation: distro.AggregateMean, NormalizeRMS: true, Workers: 1})
	if err != nil {
		return err
	}
	if _, err := nopt.Step(g1, rn.LR); err != nil {
		return err
	}
	copy(m.Params, distroStart)
	for i := range tg2 {
		tg2[i] = uint32(r.IntN(cfg.Vocab))
	}
	if _, err := m.Forward(in2, tg2, cfg.Vocab/rn.T, rn.T); err != nil {
		return err
	}
	m.ZeroGrad()
	if err := m.Backward(); err != nil {
		return err
	}
	for i, s := range cfg.Specs() {
		add("distro.grad2."+s.Name, s.Shape, m.GradTensors()[i])
	}
	frame, err = nopt.Step(m.GradTensors(), rn.LR)
	if err != nil {
		return err
	}
	if err := nopt.Apply(m.Tensors(), []*distro.Frame{frame}, rn.LR); err != nil {
		return err
	}
	for i, s := range cfg.Specs() {
		add("distro.norm.after."+s.Name, s.Shape, m.Tensors()[i])
	}
	return out.Write(ctx, dir, rn)
}
