package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/tokenizer"
	"github.com/urfave/cli/v2"
)

var dataCommand = &cli.Command{
	Name:        "data",
	Usage:       "prepare training data",
	Subcommands: []*cli.Command{dataTokenizeCommand},
}

var dataTokenizeCommand = &cli.Command{
	Name:  "tokenize",
	Usage: "turn a text file into a token file, with the byte-level tokenizer or a Hugging Face tokenizer.json",
	Description: `Reads --in and writes its tokens to --out as a flat array of little-endian
u16 or u32 integers with no header, the format trainers read. --in may name
a corpus built into psyche instead of a file: builtin:opticks is Newton's
Opticks, the text of the runs that need no files.

Without --tokenizer every byte is one token (vocabulary 256). With
--tokenizer PATH the text is encoded by that Hugging Face tokenizer.json
(a BPE model: byte-level as in GPT-2 and Llama 3, or SentencePiece-style
with byte fallback as in Llama 2); added tokens in the text such as
<|end_of_text|> become their ids, and --add-special-tokens (the default)
adds what the tokenizer's post-processor adds (Llama 2's <s>). The token
size defaults to 2 bytes when every id fits (vocabulary ≤ 65,536) and to 4
otherwise (Llama 3: 128,256); the run's model.token_size and
model.vocab_size must match what this prints.

The output is replaced atomically: a crash leaves the old file or the
complete new one.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "in", Usage: "text file to tokenize, or builtin:opticks", Required: true, Category: "DATA"},
		&cli.StringFlag{Name: "out", Usage: "token file to write", Required: true, Category: "DATA"},
		&cli.StringFlag{Name: "tokenizer", Usage: "Hugging Face tokenizer.json to encode with (default: one token per byte)", Category: "DATA"},
		&cli.BoolFlag{Name: "add-special-tokens", Value: true, Usage: "with --tokenizer, add the special tokens its post-processor adds", Category: "DATA"},
		&cli.IntFlag{Name: "token-size", Usage: "bytes per token: 2 (u16) or 4 (u32); default: 2 when the vocabulary fits, else 4", Category: "DATA"},
	},
	Action: dataTokenize,
}

func dataTokenize(c *cli.Context) error {
	in, out, tokenSize := c.String("in"), c.String("out"), c.Int("token-size")
	if c.IsSet("token-size") && tokenSize != data.TokenSize16 && tokenSize != data.TokenSize32 {
		return fmt.Errorf("--token-size must be %d or %d, got %d", data.TokenSize16, data.TokenSize32, tokenSize)
	}
	// Load the tokenizer first: a bad tokenizer.json fails before a large
	// text is read.
	var tok *tokenizer.Tokenizer
	vocab, name := data.ByteVocabSize, "byte-level"
	if path := c.String("tokenizer"); path != "" {
		var err error
		if tok, err = tokenizer.Load(path); err != nil {
			return fmt.Errorf("--tokenizer: %w", err)
		}
		vocab, name = tok.VocabSize(), path
	}
	fits16 := vocab <= 1<<16
	switch {
	case !c.IsSet("token-size") && fits16:
		tokenSize = data.TokenSize16
	case !c.IsSet("token-size"):
		tokenSize = data.TokenSize32
	case tokenSize == data.TokenSize16 && !fits16:
		return fmt.Errorf("--token-size 2 cannot hold the ids of %s (vocabulary %d > 65536): use --token-size 4", name, vocab)
	}
	text, err := readText(in)
	if err != nil {
		return fmt.Errorf("--in: %w", err)
	}
	var tokens []uint32
	if tok == nil {
		tokens = data.Tokenize(text)
	} else if tokens, err = tok.Encode(nil, string(text), c.Bool("add-special-tokens")); err != nil {
		return fmt.Errorf("tokenizing %s: %w", in, err)
	}
	if err := data.WriteTokenFile(c.Context, out, tokens, tokenSize); err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "wrote %d tokens (%d bytes, u%d, %s vocabulary %d: model.vocab_size = %d, model.token_size = %d) to %s\n",
		len(tokens), len(tokens)*tokenSize, 8*tokenSize, name, vocab, vocab, tokenSize, out)
	return nil
}

// readText reads the text at path, or the built-in corpus a builtin: path
// names.
func readText(path string) ([]byte, error) {
	if name, ok := strings.CutPrefix(path, data.BuiltinPrefix); ok {
		return data.BuiltinText(name)
	}
	return os.ReadFile(path)
}
