package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"

	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/tokenizer"
	"github.com/urfave/cli/v2"
)

var generateCommand = &cli.Command{
	Name:      "generate",
	Usage:     "continue a prompt with a trained model (a checkpoint file or a Hugging Face directory)",
	UsageText: "psyche generate --model CHECKPOINT --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S]",
	Description: `Samples one token at a time from the model's distribution over the next token,
at --temperature (0: always the likeliest) among the --top-k likeliest, and
prints the continuation as it grows. The text is tokenized with --tokenizer
(a Hugging Face tokenizer.json), with the directory's tokenizer.json for a
Hugging Face checkpoint directory that has one, or byte by byte for a model
whose vocabulary is the 256 bytes (psyche's byte runs).`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "model", Required: true, Usage: "a checkpoint: a .safetensors file psyche wrote, or a Hugging Face directory (GPT-2 or Llama: what psyche export writes, or transformers saves)", Category: "MODEL"},
		&cli.StringFlag{Name: "tokenizer", Usage: "tokenizer.json (default: the model directory's, or bytes for a 256-token vocabulary)", Category: "MODEL"},
		&cli.StringFlag{Name: "prompt", Required: true, Usage: "the text to continue", Category: "SAMPLING"},
		&cli.IntFlag{Name: "tokens", Value: 200, Usage: "tokens to generate", Category: "SAMPLING"},
		&cli.Float64Flag{Name: "temperature", Value: 0.8, Usage: "sampling temperature (0: greedy)", Category: "SAMPLING"},
		&cli.IntFlag{Name: "top-k", Value: 40, Usage: "sample among the k likeliest tokens (0: all)", Category: "SAMPLING"},
		&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "the sampler's seed: the same seed, model and prompt give the same text", Category: "SAMPLING"},
	},
	Action: generate,
}

// textCodec turns text into token ids and back.
type textCodec interface {
	encode(text string) ([]uint32, error)
	decode(ids []uint32) ([]byte, error)
}

type byteCodec struct{}

func (byteCodec) encode(text string) ([]uint32, error) {
	ids := make([]uint32, len(text))
	for i := range len(text) {
		ids[i] = uint32(text[i])
	}
	return ids, nil
}

func (byteCodec) decode(ids []uint32) ([]byte, error) {
	out := make([]byte, len(ids))
	for i, id := range ids {
		if id > 255 {
			return nil, fmt.Errorf("token %d is not a byte", id)
		}
		out[i] = byte(id)
	}
	return out, nil
}

type hfCodec struct{ t *tokenizer.Tokenizer }

func (h hfCodec) encode(text string) ([]uint32, error) { return h.t.Encode(nil, text, true) }
func (h hfCodec) decode(ids []uint32) ([]byte, error)  { return h.t.Decode(ids) }

// codecFor picks the tokenizer for a model of vocab tokens loaded from
// modelPath, as the flags' help says.
func codecFor(path, modelPath string, vocab int) (textCodec, error) {
	if path == "" {
		if fi, err := os.Stat(modelPath); err == nil && fi.IsDir() {
			if _, err := os.Stat(filepath.Join(modelPath, "tokenizer.json")); err == nil {
				path = filepath.Join(modelPath, "tokenizer.json")
			}
		}
	}
	if path == "" {
		if vocab != 256 {
			return nil, fmt.Errorf("the model's vocabulary has %d tokens, not the 256 bytes: name its tokenizer with --tokenizer tokenizer.json", vocab)
		}
		return byteCodec{}, nil
	}
	t, err := tokenizer.Load(path)
	if err != nil {
		return nil, err
	}
	if n := t.VocabSize(); n > vocab {
		return nil, fmt.Errorf("--tokenizer %s has %d tokens, more than the model's %d", path, n, vocab)
	}
	return hfCodec{t}, nil
}

func generate(c *cli.Context) error {
	if c.Int("tokens") < 0 || c.Float64("temperature") < 0 || c.Int("top-k") < 0 {
		return errors.New("--tokens, --temperature and --top-k must not be negative")
	}
	// A checkpoint from anywhere: a config larger than its tensors (a
	// config.json claiming a trillion parameters) is refused before the
	// model is allocated.
	m, err := runmodel.LoadUntrusted(c.Context, c.String("model"), nil)
	if err != nil {
		return modelError(c.String("model"), err)
	}
	cfg, err := runmodel.ConfigOf(m)
	if err != nil {
		return err
	}
	vocab := cfg.GPT.Vocab
	if cfg.Llama.Vocab != 0 {
		vocab = cfg.Llama.Vocab
	}
	codec, err := codecFor(c.String("tokenizer"), c.String("model"), vocab)
	if err != nil {
		return err
	}
	ids, err := codec.encode(c.String("prompt"))
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return errors.New("--prompt is empty")
	}
	r := rand.New(rand.NewPCG(c.Uint64("seed"), 0x67656e))
	return sample(c.App.Writer, m, codec, ids, cfg.Context(), vocab, c.Int("tokens"), c.Float64("temperature"), c.Int("top-k"), r)
}

// sample extends ids by n tokens, writing the text of each as it comes
// (the whole continuation decoded again each time, so that a character
// split over tokens appears once it is complete).
func sample(w io.Writer, m runmodel.Model, codec textCodec, ids []uint32, context, vocab, n int, temperature float64, topK int, r *rand.Rand) error {
	prompt := len(ids)
	shown := 0
	for range n {
		window := ids[max(0, len(ids)-context):]
		if _, err := m.Forward(window, nil, 1, len(window)); err != nil {
			return err
		}
		logits := m.Logits()
		last := logits[(len(window)-1)*vocab : len(window)*vocab]
		ids = append(ids, pick(last, temperature, topK, r))
		text, err := codec.decode(ids[prompt:])
		if err != nil {
			return err
		}
		// Only whole UTF-8 characters: a byte tokenizer's next token may
		// complete this one.
		end := len(text)
		for end > shown && !validUTF8Prefix(text[:end]) {
			end--
		}
		if end > shown {
			if _, err := w.Write(text[shown:end]); err != nil {
				return err
			}
			shown = end
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}

func validUTF8Prefix(b []byte) bool {
	// A complete text ends with a complete character: decoding the last
	// rune gives no error value.
	for i := len(b) - 1; i >= 0 && i >= len(b)-4; i-- {
		if b[i] < 0x80 {
			return i == len(b)-1
		}
		if b[i] >= 0xC0 { // the start of the last character
			need := 2
			switch {
			case b[i] >= 0xF0:
				need = 4
			case b[i] >= 0xE0:
				need = 3
			}
			return len(b)-i >= need
		}
	}
	return true
}

// pick draws the next token from logits: the likeliest at temperature 0,
// otherwise softmax(logits/temperature) over the topK likeliest.
func pick(logits []float32, temperature float64, topK int, r *rand.Rand) uint32 {
	order := make([]int, len(logits))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
	if temperature == 0 {
		return uint32(order[0])
	}
	if topK > 0 && topK < len(order) {
		order = order[:topK]
	}
	top := float64(logits[order[0]])
	weights := make([]float64, len(order))
	var sum float64
	for i, id := range order {
		weights[i] = math.Exp((float64(logits[id]) - top) / temperature)
		sum += weights[i]
	}
	x := r.Float64() * sum
	for i, wt := range weights {
		if x < wt {
			return uint32(order[i])
		}
		x -= wt
	}
	return uint32(order[len(order)-1]) // x left over by rounding
}
