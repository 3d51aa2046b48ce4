package fedclient

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
)

// LocalData is a client's own text, byte-tokenized: the first 90% to train
// on, the rest held out to measure the loss.
type LocalData struct {
	Path           string
	Train, Heldout []uint32
}

// ErrTooSmall means a local data file cannot fill a training sequence and a
// held-out one.
var ErrTooSmall = errors.New("fedclient: local data too small")

// LoadLocalData reads a text file for sequences of seqLen tokens.
func LoadLocalData(path string, seqLen int) (*LocalData, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fedclient: local data: %w", err)
	}
	toks := data.Tokenize(text)
	cut := len(toks) * 9 / 10
	d := &LocalData{Path: path, Train: toks[:cut], Heldout: toks[cut:]}
	if len(d.Train) < seqLen+1 || len(d.Heldout) < seqLen+1 {
		return nil, fmt.Errorf("%w: %s has %d bytes; with sequences of %d tokens it needs at least %d", ErrTooSmall, path,
			len(text), seqLen, 10*(seqLen+1)+1)
	}
	return d, nil
}

// Trainer trains one client's copy of the model.
type Trainer struct {
	Model  *gpt.Model
	Data   *LocalData
	Batch  int     // sequences per step
	SeqLen int     // tokens per sequence
	LR     float32 // AdamW's learning rate
	Clip   float32 // gradient clipping (0: off)
	opt    *distro.AdamW
	rng    *rand.Rand
}

// NewTrainer builds a trainer of a model of shape cfg; seed picks its
// batches.
func NewTrainer(cfg gpt.Config, d *LocalData, batch, seqLen int, lr, clip float32, seed uint64) (*Trainer, error) {
	m, err := gpt.New(cfg, 0, nil)
	if err != nil {
		return nil, err
	}
	sizes := make([]int, 0)
	for _, t := range m.Tensors() {
		sizes = append(sizes, len(t))
	}
	opt := distro.NewAdamW(sizes, 0.9, 0.95, 1e-8, 0)
	opt.ClipGradNorm = clip
	return &Trainer{Model: m, Data: d, Batch: batch, SeqLen: seqLen, LR: lr, Clip: clip, opt: opt,
		rng: rand.New(rand.NewPCG(seed, 0x666564))}, nil
}

// TrainRound loads params, trains steps batches and returns the update
// (the trained weights minus params) and the mean training loss.
func (t *Trainer) TrainRound(params []float32, steps int) ([]float32, float32, error) {
	if len(params) != len(t.Model.Params) {
		return nil, 0, fmt.Errorf("fedclient: the server's model has %d values, this run's shape %d", len(params), len(t.Model.Params))
	}
	copy(t.Model.Params, params)
	T, B := t.SeqLen, t.Batch
	in, tg := make([]uint32, B*T), make([]uint32, B*T)
	var sum float64
	for range steps {
		for b := range B {
			off := t.rng.IntN(len(t.Data.Train) - T)
			copy(in[b*T:], t.Data.Train[off:off+T])
			copy(tg[b*T:], t.Data.Train[off+1:off+T+1])
		}
		t.Model.ZeroGrad()
		loss, err := t.Model.Forward(in, tg, B, T)
		if err != nil {
			return nil, 0, err
		}
		if err := t.Model.Backward(); err != nil {
			return nil, 0, err
		}
		if err := t.opt.Step(t.Model.Tensors(), t.Model.GradTensors(), t.LR); err != nil {
			return nil, 0, err
		}
		sum += float64(loss)
	}
	delta := make([]float32, len(params))
	for i := range delta {
		delta[i] = t.Model.Params[i] - params[i]
	}
	return delta, float32(sum / float64(steps)), nil
}

// HeldoutLoss is the loss of params on the held-out text: up to 16
// sequences spread evenly over it (the same ones every time).
func (t *Trainer) HeldoutLoss(params []float32) (float32, error) {
	copy(t.Model.Params, params)
	T := t.SeqLen
	n := min(16, len(t.Data.Heldout)/(T+1))
	stride := (len(t.Data.Heldout) - T - 1) / max(1, n-1)
	in, tg := make([]uint32, n*T), make([]uint32, n*T)
	for b := range n {
		off := min(b*stride, len(t.Data.Heldout)-T-1)
		copy(in[b*T:], t.Data.Heldout[off:off+T])
		copy(tg[b*T:], t.Data.Heldout[off+1:off+T+1])
	}
	return t.Model.Forward(in, tg, n, T)
}
