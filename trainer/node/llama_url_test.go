package node

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p/memnet"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// A Llama run's checkpoint URL may name a Hugging Face directory, on this
// machine or over HTTP (sharded here, in bf16 for one of them); the node
// loads it, checks it against the run's model and its revision, and
// refuses one whose config.json describes another shape before training.
func TestLoadLlamaCheckpointDirectory(t *testing.T) {
	cfg := llama.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 4, KVHeads: 2, Intermediate: 24, RopeTheta: 10000}
	want, err := llama.New(cfg, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	ctx := context.Background()
	if err := want.SaveHF(ctx, filepath.Join(root, "hf"), llama.HFOptions{MaxShardBytes: 4096}); err != nil {
		t.Fatal(err)
	}
	otherCfg := cfg
	otherCfg.KVHeads = 4
	other, _ := llama.New(otherCfg, 5, nil)
	if err := other.SaveHF(ctx, filepath.Join(root, "other"), llama.HFOptions{DType: "BF16"}); err != nil {
		t.Fatal(err)
	}
	// A config.json that describes a model of about a terabyte (the shape
	// only: no weights): refused before anything is allocated for it.
	huge := filepath.Join(root, "huge")
	if err := os.MkdirAll(huge, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(huge, llama.HFConfigFile), []byte(`{"model_type": "llama", "vocab_size": 128256,
		"max_position_embeddings": 131072, "hidden_size": 65536, "num_hidden_layers": 400, "num_attention_heads": 512,
		"num_key_value_heads": 64, "intermediate_size": 131072}`), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(root)))
	defer srv.Close()
	rev := runmodel.Revision(want)
	for _, tc := range []struct {
		name, url, revision, err string
	}{
		{"local directory", "file://" + filepath.Join(root, "hf"), rev, ""},
		{"http directory", srv.URL + "/hf", rev, ""},
		{"seed", "seed:5", rev, ""},
		{"another shape", srv.URL + "/other", "", "n_kv_heads is 4 in the model, 2 in the run"},
		{"no checkpoint there", srv.URL + "/none", "", "config.json: file does not exist"},
		{"a terabyte model over http", srv.URL + "/huge", "", "d_model is 65536 in the model, 16 in the run"},
		{"a terabyte model on this machine", "file://" + huge, "", "n_layers is 400 in the model, 1 in the run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &coordinator.Coordinator{}
			s.Model = coordinator.Model{DataKind: coordinator.DataLocal, TokenSize: 2,
				Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64}}
			modelspec.SetLlama(&s.Model, cfg)
			s.Model.Checkpoint.Kind = coordinator.CheckpointHub
			_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.URL[:], tc.url)
			_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.Revision[:], tc.revision)
			_ = coordinator.SetFixedString(s.Model.DataLocation[:], "builtin:opticks")
			seed := sha256.Sum256([]byte(tc.name))
			net := memnet.NewHub().Join("run", ed25519.NewKeyFromSeed(seed[:]), coordinator.Pubkey{1})
			n := &Node{cfg: config{log: slog.New(slog.DiscardHandler), workers: 1}, net: net}
			err := loadRecorded(ctx, n, s)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("load = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n.Model().Hash() != want.Hash() {
				t.Fatal("other weights")
			}
			// The next epoch keeps this model only if its config is the
			// run's, whatever file it came from.
			if run, _ := modelspec.ModelConfig(&s.Model); n.engine().Config() != run {
				t.Fatalf("the loaded model's config %+v is not the run's %+v", n.engine().Config(), run)
			}
		})
	}
}
