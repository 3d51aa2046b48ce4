package fedclient

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"unicode/utf8"

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

// ErrNotText means local data is not text (a binary file picked by mistake):
// training a byte-level model on it wastes the round and moves the shared
// model away from everyone else's text.
var ErrNotText = errors.New("fedclient: local data is not text")

// ErrTooLarge means local data is over MaxLocalData.
var ErrTooLarge = errors.New("fedclient: local data too large")

// MaxLocalData is the largest local text a client takes: each byte becomes
// a 4-byte token in memory, and a browser tab has a few GiB at most.
const MaxLocalData = 256 << 20

// CheckText says whether b reads as text: UTF-8 (a multi-byte character cut
// at either end, as a slice of a larger file has, is allowed), no NUL byte,
// and at most 1% control characters other than tab, newline, carriage
// return and form feed.
func CheckText(name string, b []byte) error {
	if len(b) > MaxLocalData {
		return fmt.Errorf("%w: %s has %d bytes; the most a client takes is %d MiB", ErrTooLarge, name, len(b), MaxLocalData>>20)
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return fmt.Errorf("%w: %s has a NUL byte at offset %d (a binary file?)", ErrNotText, name, i)
	}
	body := b
	for k := 0; k < utf8.UTFMax-1 && len(body) > 0 && !utf8.RuneStart(body[0]); k++ {
		body = body[1:]
	}
	if i := invalidUTF8(body); i >= 0 && i < len(body)-(utf8.UTFMax-1) {
		return fmt.Errorf("%w: %s is not UTF-8 (offset %d)", ErrNotText, name, len(b)-len(body)+i)
	}
	control := 0
	for _, c := range b {
		if c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' || c == 0x7f {
			control++
		}
	}
	if control*100 > len(b) {
		return fmt.Errorf("%w: %s is %.1f%% control characters", ErrNotText, name, 100*float64(control)/float64(len(b)))
	}
	return nil
}

// invalidUTF8 is the offset of the first byte of b that starts no valid
// UTF-8 character, or -1.
func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// LoadLocalData reads a text file for sequences of seqLen tokens.
func LoadLocalData(path string, seqLen int) (*LocalData, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fedclient: local data: %w", err)
	}
	return NewLocalData(path, text, seqLen)
}

// NewLocalData splits text, named name in messages (a path, or the file
// name a browser gives), for sequences of seqLen tokens.
func NewLocalData(name string, text []byte, seqLen int) (*LocalData, error) {
	if err := CheckText(name, text); err != nil {
		return nil, err
	}
	toks := data.Tokenize(text)
	cut := len(toks) * 9 / 10
	d := &LocalData{Path: name, Train: toks[:cut], Heldout: toks[cut:]}
	if len(d.Train) < seqLen+1 || len(d.Heldout) < seqLen+1 {
		return nil, fmt.Errorf("%w: %s has %d bytes; with sequences of %d tokens it needs at least %d", ErrTooSmall, name,
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
	// OnStep, if set, is called after each local step with its loss (a
	// page shows the round's progress with it).
	OnStep func(loss float32)
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
		if t.OnStep != nil {
			t.OnStep(loss)
		}
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
