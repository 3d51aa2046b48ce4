package fedclient_test

import (
	"testing"

	"github.com/psyche-go/psyche/federated/fedclient"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
)

// BenchmarkTrainStep is one local step of examples/federated-run.toml's
// model (the browser trainer's hot path: GOOS=js GOARCH=wasm go test -bench
// runs it under node, the page's engine, beside the native figure).
func BenchmarkTrainStep(b *testing.B) {
	cfg := gpt.Config{Vocab: 256, Context: 32, Width: 32, Layers: 1, Heads: 2}
	d, err := fedclient.NewLocalData("opticks", data.Opticks()[:60000], cfg.Context)
	if err != nil {
		b.Fatal(err)
	}
	t, err := fedclient.NewTrainer(cfg, d, 4, cfg.Context, 4e-3, 1, 1)
	if err != nil {
		b.Fatal(err)
	}
	params := append([]float32(nil), t.Model.Params...)
	b.SetBytes(int64(t.Batch * t.SeqLen)) // "MB/s" reads as millions of tokens a second
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := t.TrainRound(params, 1); err != nil {
			b.Fatal(err)
		}
	}
}
