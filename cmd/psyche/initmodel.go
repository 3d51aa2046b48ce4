package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
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
directory (config.json, model.safetensors) that transformers loads too.

A Hugging Face transformers run (hf_config) is drawn by the PyTorch engine,
as its trainers draw it. Without --out the revision is the config.json's hash
(what a seed:N run records); with --out the drawn model is written as a
Hugging Face directory for url = "file:///DIR" (leave hf_config out then: the
directory's config.json is the model's), and the revision is the hash of the
config and the weights.`,
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
	if u.Model.Architecture == coordinator.ArchTransformers {
		return initTransformers(c, path, u.Model, seed)
	}
	// The weights are drawn a range at a time as they are hashed and
	// written (twice over: the hash first, so that the file's header can
	// name it), never held whole: a 1B model is 5 GB of float32.
	cfg, err := modelspec.ModelConfig(u.Model)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	seeded, err := runmodel.Seeded(cfg, seed)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "model: %d parameters, weights drawn from %s\n", cfg.NumParams(), modelspec.SeedURL(seed))
	rev, err := seeded.Revision(c.Context)
	if err != nil {
		return err
	}
	url = modelspec.SeedURL(seed)
	if out := c.String("out"); out != "" {
		abs, err := filepath.Abs(out)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			return err
		}
		if cfg.Arch == coordinator.ArchLlama && !strings.HasSuffix(abs, ".safetensors") {
			// F32, so the directory's model hashes as this one.
			err = runmodel.SaveWeights(c.Context, seeded, abs, false, nil)
		} else {
			// The seed and hash in the metadata say where the file came
			// from; the hash a trainer checks is computed from the tensors.
			err = runmodel.SaveWeightsFile(c.Context, seeded, abs, map[string]string{"seed": fmt.Sprint(seed), "revision": rev})
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
	if recorded := coordinator.FixedString(u.Model.Checkpoint.Source.Revision[:]); weights.IsHash(recorded) && recorded != rev {
		fmt.Fprintf(w, "note: %s records revision %q: trainers would refuse this model\n", path, recorded)
	}
	return nil
}

// initTransformers is init-model for a run of a Hugging Face transformers
// model: only the PyTorch engine builds it, so the weights are drawn there
// (and only when they are to be written: a seed:N run's revision is its
// config's hash).
func initTransformers(c *cli.Context, path string, m *coordinator.Model, seed uint64) error {
	t, dir, err := runmodel.RunTransformersConfig(m)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if dir != "" {
		return fmt.Errorf("%s starts from the checkpoint directory %s: init-model draws fresh weights, for a run whose url is seed:N", path, dir)
	}
	t.Seed = seed
	w := c.App.Writer
	out := c.String("out")
	if out == "" {
		fmt.Fprintf(w, "model: a transformers model every trainer draws from %s (no weights written: --out writes them)\n", modelspec.SeedURL(seed))
		fmt.Fprintln(w, "[model.checkpoint]")
		fmt.Fprintf(w, "url = %q\n", modelspec.SeedURL(seed))
		fmt.Fprintf(w, "revision = %q\n", modelspec.ConfigHash(t.JSON))
		return nil
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "drawing the model from %s with the torch engine\n", modelspec.SeedURL(seed))
	model, err := drawTransformers(c.Context, t)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := model.Save(c.Context, abs, nil); err != nil {
		return err
	}
	rev := runmodel.Revision(model)
	fmt.Fprintf(w, "model: %d parameters, weights drawn from %s\nwrote %s (config.json, model.safetensors)\n", model.NumParams(), modelspec.SeedURL(seed), abs)
	fmt.Fprintln(w, "[model.checkpoint]")
	fmt.Fprintf(w, "url = %q\n", "file://"+abs)
	fmt.Fprintf(w, "revision = %q\n", rev)
	fmt.Fprintln(w, "note: with this url, leave the run file's hf_config out (the directory's config.json is the model's)")
	return nil
}
