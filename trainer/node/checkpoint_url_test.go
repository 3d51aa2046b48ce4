package node

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p/memnet"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// The run's checkpoint source may be a file on this machine or an HTTP(S)
// URL read with range requests; either way the model must be the run's.
func TestLoadCheckpointURL(t *testing.T) {
	cfg := gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}
	want, err := gpt.New(cfg, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	if err := want.Save(context.Background(), path, nil); err != nil {
		t.Fatal(err)
	}
	other, _ := gpt.New(gpt.Config{Vocab: 256, Context: 16, Width: 32, Layers: 1, Heads: 2}, 3, nil)
	if err := other.Save(context.Background(), filepath.Join(dir, "bigger.safetensors"), nil); err != nil {
		t.Fatal(err)
	}
	// A checkpoint file whose metadata describes a GPT of about a
	// terabyte and holds no weights: its few bytes pass the run's size
	// limit, and the model it describes must be refused before it is
	// allocated.
	hugeMeta, err := checkpoint.WithModelConfig(nil, checkpoint.ModelConfig{Architecture: checkpoint.ArchGPT,
		VocabSize: 1 << 20, MaxSeqLen: 1 << 16, DModel: 1 << 16, NLayers: 1000, NHeads: 64})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.Save(context.Background(), filepath.Join(dir, "huge.safetensors"), nil, hugeMeta); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	mux := http.NewServeMux()
	mux.Handle("/files/", http.StripPrefix("/files/", http.FileServer(http.Dir(dir)))) // ranges supported
	mux.HandleFunc("/short", func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "short", time.Time{}, strings.NewReader(string(raw[:len(raw)-10])))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	n := &Node{cfg: config{dataOpts: []data.Option{data.WithRetries(1)}}}
	for _, tc := range []struct {
		name, url string
		err       error // nil: loads want
	}{
		{"seed", "seed:3", nil}, // drawn here: want was drawn from seed 3 too
		{"file", "file://" + path, nil},
		{"http", srv.URL + "/files/model.safetensors", nil},
		{"missing", srv.URL + "/files/none.safetensors", data.ErrNotFound},
		{"truncated", srv.URL + "/short", checkpoint.ErrMalformed}, // the header names bytes past the end
		{"more tensor bytes than the run's model", srv.URL + "/files/bigger.safetensors", checkpoint.ErrTooLarge},
		{"a terabyte model's metadata over http", srv.URL + "/files/huge.safetensors", runmodel.ErrMismatch},
		{"a terabyte model's metadata on this machine", "file://" + filepath.Join(dir, "huge.safetensors"), runmodel.ErrMismatch},
	} {
		got, err := n.loadURL(context.Background(), tc.url, runmodel.Config{Arch: coordinator.ArchGPT, GPT: cfg})
		switch {
		case tc.err == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == nil && !slices.Equal(paramsOf(got), want.Params):
			t.Errorf("%s: other weights", tc.name)
		case tc.err != nil && !errors.Is(err, tc.err):
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.err)
		}
	}
	for _, url := range []string{"s3://bucket/model", "seed:x", "seed:-1"} {
		if _, err := n.loadURL(context.Background(), url, runmodel.Config{Arch: coordinator.ArchGPT, GPT: cfg}); !errors.Is(err, runmodel.ErrSource) {
			t.Errorf("%s: %v, want runmodel.ErrSource", url, err)
		}
	}
}

// A run's revision that is a model hash is checked against the model the
// trainer loads from the run's URL, whatever the source: a different model
// stops the node before it trains (no retry loads another). A revision that
// is no hash is a label, never checked.
func TestLoadChecksRevision(t *testing.T) {
	cfg := gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}
	seeded, err := gpt.New(cfg, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "init.safetensors")
	if err := seeded.Save(context.Background(), path, nil); err != nil {
		t.Fatal(err)
	}
	other, _ := gpt.New(cfg, 2, nil)
	hash, otherHash := runmodel.Revision(seeded), runmodel.Revision(other)
	if hash == otherHash {
		t.Fatal("seeds 1 and 2 hash alike")
	}
	for _, url := range []string{"seed:1", "file://" + path} {
		for _, tc := range []struct {
			name, revision string
			refused        bool
		}{
			{"match", hash, false},
			{"mismatch", otherHash, true},
			{"no revision", "", false},
			{"a label", "v1", false},
			{"upper-case hex is a label", strings.ToUpper(otherHash), false},
		} {
			s := &coordinator.Coordinator{}
			s.Model = coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
				Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64}}
			runmodel.SetGPT(&s.Model, cfg)
			s.Model.Checkpoint.Kind = coordinator.CheckpointHub
			_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.URL[:], url)
			_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.Revision[:], tc.revision)
			_ = coordinator.SetFixedString(s.Model.DataLocation[:], "builtin:opticks")
			seed := sha256.Sum256([]byte(tc.name))
			net := memnet.NewHub().Join("run", ed25519.NewKeyFromSeed(seed[:]), coordinator.Pubkey{1})
			n := &Node{cfg: config{log: slog.New(slog.DiscardHandler), workers: 1}, net: net}
			err := n.load(context.Background(), s, false)
			switch {
			case !tc.refused && err != nil:
				t.Errorf("%s, %s: %v", url, tc.name, err)
			case !tc.refused && !slices.Equal(paramsOf(n.model), seeded.Params):
				t.Errorf("%s, %s: other weights", url, tc.name)
			case tc.refused:
				want := fmt.Sprintf("node: the model from %s has hash %s, the run records %s: refusing to train", url, hash, otherHash)
				if !errors.Is(err, runmodel.ErrRevision) || errors.Is(err, errLoadLater) || err.Error() != want {
					t.Errorf("%s, %s: %v, want %q (not to be retried)", url, tc.name, err, want)
				}
				if n.model != nil || n.opt != nil {
					t.Errorf("%s, %s: the refused model was kept", url, tc.name)
				}
			}
		}
	}
}
