package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/urfave/cli/v2"
)

// The engine flags of join and localnet: what computes a trainer's rounds.
var (
	engineFlag = &cli.StringFlag{Name: "engine", Value: "go", Category: "ENGINE",
		Usage: "what computes: go (this binary's kernels) or torch (a PyTorch worker under --python, which needs torch 2.6+ and numpy: bash scripts/setup-torch installs them); localnet takes a list, one per trainer, repeated (go,torch: a mixed run)"}
	deviceFlag = &cli.StringFlag{Name: "device", Value: "cpu", Category: "ENGINE",
		Usage: "with --engine torch: cpu, cuda, cuda:N or mps"}
	devicesFlag = &cli.StringFlag{Name: "devices", Category: "ENGINE",
		Usage: "with --engine torch, instead of --device: one trainer over several devices, a process each under torch.distributed: cuda:0,cuda:1,… or all (every GPU torch sees; NCCL), cpu,cpu (gloo); localnet: every torch trainer"}
	pythonFlag = &cli.StringFlag{Name: "python", Category: "ENGINE",
		Usage: "with --engine torch: the python to run the worker under (default: the environment bash scripts/setup-torch installs, then python3 on PATH, then /usr/bin/python3: the first with torch 2.6+ and numpy)"}
	compileFlag = &cli.BoolFlag{Name: "compile", Category: "ENGINE",
		Usage: "with --engine torch: compile the model with torch.compile (a shape's first use compiles it; the kernels are cached in the user's cache directory)"}
	placementFlag = &cli.StringFlag{Name: "placement", Value: "auto", Category: "ENGINE",
		Usage: "with --engine torch and --devices: how the devices hold the model: auto (data parallel when each device holds it, its gradient and DisTrO state; else shard), replicate, or shard (FSDP2: parameters and gradients sharded per transformer block)"}
	deviceMemoryFlag = &cli.StringFlag{Name: "device-memory", Category: "ENGINE",
		Usage: "with --engine torch: the most memory a trainer's model may take on its device, e.g. 20GiB or 512MiB (default: the device's; on the CPU the machine's RAM); a transformers run whose training state (20 bytes a parameter) needs more is refused before joining"}
)

// engineKinds reads --engine: one kind, or (allowMany) a comma-separated
// list of them.
func engineKinds(c *cli.Context, allowMany bool) ([]string, error) {
	var kinds []string
	for _, k := range strings.Split(c.String("engine"), ",") {
		k = strings.TrimSpace(k)
		if k != "go" && k != "torch" {
			return nil, fmt.Errorf("--engine %q: want go or torch", c.String("engine"))
		}
		kinds = append(kinds, k)
	}
	if len(kinds) > 1 && !allowMany {
		return nil, fmt.Errorf("--engine %q: a trainer has one engine: go or torch", c.String("engine"))
	}
	// Values, not IsSet: the flags are shared by every run of the app in a
	// process (the tests'), and urfave/cli remembers a flag once set.
	if !contains(kinds, "torch") {
		switch {
		case c.String("device") != "cpu":
			return nil, fmt.Errorf("--device %s is for --engine torch (the go engine computes with its kernels: --precision, or a -tags cuda build)", c.String("device"))
		case c.String("devices") != "":
			return nil, fmt.Errorf("--devices %s is for --engine torch", c.String("devices"))
		case c.String("python") != "":
			return nil, fmt.Errorf("--python is for --engine torch")
		case c.Bool("compile"):
			return nil, fmt.Errorf("--compile is for --engine torch")
		case c.String("placement") != "auto":
			return nil, fmt.Errorf("--placement is for --engine torch with --devices")
		case c.String("device-memory") != "":
			return nil, fmt.Errorf("--device-memory is for --engine torch")
		}
	}
	return kinds, nil
}

func contains(v []string, s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

// checkEngines says, before anything else starts, whether this machine can
// run the engines asked for: the one line a user reads when python or torch
// is missing, or the device is not there.
func checkEngines(ctx context.Context, c *cli.Context, kinds []string, prec kernels.Precision) error {
	if !contains(kinds, "torch") {
		return nil
	}
	op, err := newTorch(c, prec, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	info, err := op.Check(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "engine: %s\n", info)
	return nil
}

func newTorch(c *cli.Context, prec kernels.Precision, log *slog.Logger) (*torch.Opener, error) {
	dev := torch.WithDevice(c.String("device"))
	if ds := c.String("devices"); ds != "" {
		if c.String("device") != "cpu" {
			return nil, fmt.Errorf("--device %s and --devices %s: give one (--devices for several, --device for one)", c.String("device"), ds)
		}
		list := strings.Split(ds, ",")
		for i := range list {
			list[i] = strings.TrimSpace(list[i])
		}
		dev = torch.WithDevices(list)
	}
	var memory int64
	if m := c.String("device-memory"); m != "" {
		var err error
		if memory, err = parseBytes(m); err != nil {
			return nil, fmt.Errorf("--device-memory %s: %w", m, err)
		}
	}
	return torch.New(dev, torch.WithPrecision(prec), torch.WithPython(c.String("python")),
		torch.WithCompile(c.Bool("compile")), torch.WithPlacement(c.String("placement")), torch.WithMemory(memory), torch.WithLogger(log))
}

// byteUnits are the suffixes parseBytes reads, largest first.
var byteUnits = []struct {
	suffix string
	bytes  float64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// parseBytes reads a size: a number of bytes, or a number (a fraction is
// allowed) followed by KiB, MiB, GiB or TiB.
func parseBytes(s string) (int64, error) {
	num, scale := strings.TrimSpace(s), 1.0
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, scale = strings.TrimSpace(rest), u.bytes
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || math.IsInf(v*scale, 0) || v*scale >= math.MaxInt64 {
		return 0, fmt.Errorf("want a positive size: bytes, or a number with KiB, MiB, GiB or TiB (20GiB)")
	}
	return int64(v * scale), nil
}

// engineOption is the node option of an engine kind (none for go: the
// node's default).
func engineOption(c *cli.Context, kind string, prec kernels.Precision, log *slog.Logger) ([]node.Option, error) {
	if kind != "torch" {
		return nil, nil
	}
	op, err := newTorch(c, prec, log)
	if err != nil {
		return nil, err
	}
	return []node.Option{node.WithEngine(op)}, nil
}

var _ engine.Opener = (*torch.Opener)(nil)
