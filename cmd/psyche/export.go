package main

import (
	"fmt"

	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/urfave/cli/v2"
)

var exportCommand = &cli.Command{
	Name:      "export",
	Usage:     "write a checkpoint in another layout: --to hf writes a Hugging Face directory (GPT-2 or Llama) that transformers loads",
	UsageText: "psyche export --to hf --model CHECKPOINT --out DIR",
	Description: `Reads any checkpoint a run wrote (a .safetensors file, or a Hugging Face
directory) and writes it as a Hugging Face directory: config.json and
model.safetensors. A GPT becomes transformers' GPT2LMHeadModel (tensors named
transformer.h.N.attn.c_attn.weight and so on, its linear weights stored
input-major as GPT-2's Conv1D keeps them, the head tied to the embedding); a
Llama becomes LlamaForCausalLM. Then, in Python:

    AutoModelForCausalLM.from_pretrained("DIR")

The model's tokenizer is not part of a checkpoint: copy the run's
tokenizer.json into DIR (a byte run's ids are the bytes themselves).`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "to", Value: "hf", Usage: "the layout to write: hf", Category: "EXPORT"},
		&cli.StringFlag{Name: "model", Required: true, Usage: "the checkpoint to read: a .safetensors file a run wrote, or a Hugging Face directory (GPT-2 or Llama)", Category: "EXPORT"},
		&cli.StringFlag{Name: "out", Required: true, Usage: "the directory to write (created if needed)", Category: "EXPORT"},
	},
	Action: export,
}

func export(c *cli.Context) error {
	if c.String("to") != "hf" {
		return fmt.Errorf("--to %q: the one layout is hf (Hugging Face)", c.String("to"))
	}
	// A checkpoint from anywhere: a config larger than its tensors (a
	// config.json claiming a trillion parameters) is refused before the
	// model is allocated.
	m, err := runmodel.LoadUntrusted(c.Context, c.String("model"), nil)
	if err != nil {
		return modelError(c.String("model"), err)
	}
	out := c.String("out")
	switch m := m.(type) {
	case *gpt.Model:
		err = m.SaveHF(c.Context, out)
	case *llama.Model:
		err = m.SaveHF(c.Context, out, llama.HFOptions{})
	default:
		err = fmt.Errorf("export: a %T cannot be written as a Hugging Face directory", m)
	}
	if err != nil {
		return err
	}
	cfg, err := runmodel.ConfigOf(m)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "wrote %s (%s, %d parameters, hash %s): config.json and model.safetensors\n",
		out, modelspec.ArchTitle(cfg.Arch), m.NumParams(), runmodel.Revision(m))
	return nil
}
