package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/urfave/cli/v2"
)

var initModelCommand = &cli.Command{
	Name:      "init-model",
	Usage:     "build a run's starting model from a seed and print the revision (model hash) its run file records",
	UsageText: "psyche init-model --config RUN.toml [--seed N] [--out FILE]",
	Description: `Builds the model the run file's [model] section describes with fresh weights
drawn from --seed (default: N when the run file's checkpoint url is "seed:N"):
the same weights every trainer draws for url = "seed:N". It prints the model's
parameter count and the revision line for [model.checkpoint]: the first 16
bytes of the model's SHA-256 as 32 hex digits. A trainer that loads the run's
model from its url checks a revision of 32 lowercase hex digits and refuses to
train a model with another hash; any other revision is a label, not checked.

Without --out nothing is written: the command only computes the hash (for a
seed:N run, whose trainers need no file). With --out it also writes the model
as a safetensors checkpoint, atomically, for a run whose url names that file
on every trainer (file://) or a server holding a copy (http(s)://). A Llama
with an --out that does not end in .safetensors is written as a Hugging Face
directory (config.json, model.safetensors) that transformers loads too.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "the run file (TOML) whose [model] to build", Required: true, Category: "MODEL"},
		&cli.Uint64Flag{Name: "seed", Usage: "seed of the initial weights", DefaultText: `N of the run file's url = "seed:N"`, Category: "MODEL"},
		&cli.StringFlag{Name: "out", Usage: "write the model to this safetensors file (a Llama to a Hugging Face directory unless the name ends in .safetensors)", Category: "MODEL"},
	},
	Action: initModel,
}

func initModel(c *cli.Context) error {
	path := c.String("config")
	u, err := loadRunFile(path)
	if err != nil {
		return err
	}
	if u.Model == nil {
		return fmt.Errorf("%s has no [model] section: init-model builds the model it describes", path)
	}
	url := coordinator.FixedString(u.Model.Checkpoint.Source.URL[:])
	seed := c.Uint64("seed")
	if !c.IsSet("seed") {
		// loadRunFile accepted the url, so it parses.
		src, err := modelspec.ParseSource(url)
		if err != nil || src.Kind != modelspec.FromSeed {
			return fmt.Errorf("--seed is needed: %s's checkpoint url is %q, not seed:N", path, url)
		}
		seed = src.Seed
	}
	model, err := runmodel.Init(u.Model, seed, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	w := c.App.Writer
	rev := runmodel.Revision(model)
	fmt.Fprintf(w, "model: %d parameters, weights drawn from %s\n", model.NumParams(), modelspec.SeedURL(seed))
	url = modelspec.SeedURL(seed)
	if out := c.String("out"); out != "" {
		abs, err := filepath.Abs(out)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			return err
		}
		if lm, ok := model.(*llama.Model); ok && !strings.HasSuffix(abs, ".safetensors") {
			// F32, so the directory's model hashes as this one.
			err = lm.SaveHF(c.Context, abs, llama.HFOptions{})
		} else {
			// The seed and hash in the metadata say where the file came
			// from; the hash a trainer checks is computed from the tensors.
			err = model.Save(c.Context, abs, map[string]string{"seed": fmt.Sprint(seed), "revision": rev})
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s\n", abs)
		url = "file://" + abs // or an http(s):// URL serving a copy
	}
	// Lines to paste into the run file.
	fmt.Fprintln(w, "[model.checkpoint]")
	fmt.Fprintf(w, "url = %q\n", url)
	fmt.Fprintf(w, "revision = %q\n", rev)
	if recorded := coordinator.FixedString(u.Model.Checkpoint.Source.Revision[:]); runmodel.IsHash(recorded) && recorded != rev {
		fmt.Fprintf(w, "note: %s records revision %q: trainers would refuse this model\n", path, recorded)
	}
	return nil
}
