package parity

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
)

func providers(t *testing.T, seqLen int) (train, val *data.Provider) {
	t.Helper()
	ctx := context.Background()
	tokens := data.Tokenize(data.Opticks())
	cut := len(tokens) * 9 / 10
	open := func(toks []uint32, opts ...data.Option) *data.Provider {
		enc, err := data.EncodeTokens(nil, toks, data.TokenSize16)
		if err != nil {
			t.Fatal(err)
		}
		p, err := data.NewProvider(ctx, data.NewBytesSource(enc), data.TokenSize16, seqLen, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return open(tokens[:cut], data.WithShuffleSeed(1)), open(tokens[cut:])
}

// TestParitySmall is the reduced experiment CI runs: a tiny model for a few
// dozen steps. Both optimizers must learn, DisTrO must send far fewer bytes
// than dense gradients, and the whole experiment must be reproducible.
func TestParitySmall(t *testing.T) {
	cfg := Config{
		Model:  gpt.Config{Vocab: 256, Context: 32, Width: 32, Layers: 1, Heads: 2},
		SeqLen: 32, Batch: 8, Peers: 4, Steps: 40, WarmupSteps: 4, AdamLR: 3e-3, DistroLR: 3e-3,
		Distro:    distro.Options{Chunk: 64, TopK: 8, Quantize1Bit: true, RiceIndices: true, ClipGradNorm: 1, Decay: 0.95, Workers: 2},
		EvalEvery: 20, EvalSeqs: 16, Seed: 7,
	}
	train, val := providers(t, cfg.SeqLen)
	var log bytes.Buffer
	res, err := Run(context.Background(), cfg, train, val, &log)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	res.Print(&table)
	t.Log("\n" + log.String() + table.String())
	initial := math.Log(256)
	last := res.Rows[len(res.Rows)-1]
	if last.AdamLoss > initial-1 || last.DistroLoss > initial-1 {
		t.Errorf("did not learn: validation losses %.3f (adamw) and %.3f (distro), uniform is %.3f", last.AdamLoss, last.DistroLoss, initial)
	}
	if res.Compression() < 20 {
		t.Errorf("frames are only %.0fx smaller than dense gradients", res.Compression())
	}
	if len(res.Rows) != 2 || res.Rows[1].Tokens != int64(40*8*32) {
		t.Errorf("rows %+v", res.Rows)
	}
	for _, want := range []string{"adamw val", "bytes sent per peer per step", "achieved GFLOP/s"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	again, err := Run(context.Background(), cfg, train, val, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range res.Rows {
		if res.Rows[i] != again.Rows[i] {
			t.Fatalf("not reproducible: %+v vs %+v", res.Rows[i], again.Rows[i])
		}
	}
}

func TestConfigValidation(t *testing.T) {
	good := Config{Model: gpt.Config{Vocab: 256, Context: 8, Width: 8, Layers: 1, Heads: 1}, SeqLen: 8, Batch: 4, Peers: 2,
		Steps: 1, EvalEvery: 1, EvalSeqs: 1}
	if err := good.validate(); err != nil {
		t.Fatal(err)
	}
	for _, edit := range []func(*Config){
		func(c *Config) { c.Batch = 3 },
		func(c *Config) { c.SeqLen = 9 },
		func(c *Config) { c.Steps = 0 },
		func(c *Config) { c.Model.Heads = 3 },
	} {
		c := good
		edit(&c)
		if c.validate() == nil {
			t.Errorf("accepted %+v", c)
		}
	}
}

func TestMomentumLR(t *testing.T) {
	cfg := Config{Steps: 100, WarmupSteps: 10, DistroLR: 0.02}
	for _, tc := range []struct {
		rule MomentumLR
		step int
		want float32
	}{
		{MomentumScheduled, 4, cfg.lr(0.02, 4)},
		{MomentumScheduled, 60, cfg.lr(0.02, 60)},
		{MomentumPeak, 4, 0.02},
		{MomentumPeak, 60, 0.02},
		{MomentumHeld, 4, cfg.lr(0.02, 4)},
		{MomentumHeld, 60, 0.02},
		{MomentumSquared, 60, cfg.lr(0.02, 60) * cfg.lr(0.02, 60) / 0.02},
	} {
		cfg.MomentumLR = tc.rule
		if got := cfg.momentumLR(tc.step); got != tc.want {
			t.Errorf("%v at step %d: %g, want %g", tc.rule, tc.step, got, tc.want)
		}
	}
	if cfg.lr(0.02, 4) >= 0.02 || cfg.lr(0.02, 60) >= 0.02 {
		t.Fatal("the schedule should be below the peak at steps 4 and 60")
	}
	for _, name := range []string{"scheduled", "peak", "held", "squared"} {
		m, err := ParseMomentumLR(name)
		if err != nil || m.String() != name {
			t.Errorf("ParseMomentumLR(%q) = %v, %v", name, m, err)
		}
	}
	zero, half := float32(0), float32(0.5)
	for _, tc := range []struct {
		final *float32
		want  float32
	}{{nil, cfg.lr(0.02, 99)}, {&zero, 0}, {&half, 0.01}} {
		cfg.DistroFinalLR, cfg.AdamLR, cfg.AdamFinalLR = tc.final, 0.02, tc.final
		if got := cfg.distroLR(99); math.Abs(float64(got-tc.want)) > 1e-9 {
			t.Errorf("final rate %v: DisTrO's %g at the last step, want %g", tc.final, got, tc.want)
		}
		if got := cfg.adamLR(99); math.Abs(float64(got-tc.want)) > 1e-9 {
			t.Errorf("final rate %v: AdamW's %g at the last step, want %g", tc.final, got, tc.want)
		}
	}
	if _, err := ParseMomentumLR("fast"); err == nil {
		t.Error(`ParseMomentumLR("fast") succeeded`)
	}
}
