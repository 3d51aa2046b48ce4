package main

import (
	"fmt"
	"os"

	"github.com/psyche-go/psyche/trainer/data"
	"github.com/urfave/cli/v2"
)

var dataCommand = &cli.Command{
	Name:        "data",
	Usage:       "prepare training data",
	Subcommands: []*cli.Command{dataTokenizeCommand},
}

var dataTokenizeCommand = &cli.Command{
	Name:  "tokenize",
	Usage: "turn a text file into a token file with the byte-level tokenizer",
	Description: `Reads --in, turns every byte into one token (vocabulary 256) and writes the
tokens to --out as a flat array of little-endian u16 or u32 integers with no
header, the format trainers read. The output is replaced atomically: a crash
leaves the old file or the complete new one.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "in", Usage: "text file to tokenize", Required: true, Category: "DATA"},
		&cli.StringFlag{Name: "out", Usage: "token file to write", Required: true, Category: "DATA"},
		&cli.IntFlag{Name: "token-size", Value: data.TokenSize16, Usage: "bytes per token: 2 (u16) or 4 (u32)", Category: "DATA"},
	},
	Action: dataTokenize,
}

func dataTokenize(c *cli.Context) error {
	in, out, tokenSize := c.String("in"), c.String("out"), c.Int("token-size")
	if tokenSize != data.TokenSize16 && tokenSize != data.TokenSize32 {
		return fmt.Errorf("--token-size must be %d or %d, got %d", data.TokenSize16, data.TokenSize32, tokenSize)
	}
	text, err := os.ReadFile(in)
	if err != nil {
		return fmt.Errorf("--in: %w", err)
	}
	tokens := data.Tokenize(text)
	if err := data.WriteTokenFile(c.Context, out, tokens, tokenSize); err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "wrote %d tokens (%d bytes, u%d, byte-level vocabulary %d) to %s\n",
		len(tokens), len(tokens)*tokenSize, 8*tokenSize, data.ByteVocabSize, out)
	return nil
}
