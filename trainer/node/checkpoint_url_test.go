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
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/weights"
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
		{"a terabyte model's metadata over http", srv.URL + "/files/huge.safetensors", modelspec.ErrMismatch},
		{"a terabyte model's metadata on this machine", "file://" + filepath.Join(dir, "huge.safetensors"), modelspec.ErrMismatch},
	} {
		var got runmodel.Model
		w, err := n.loadURL(context.Background(), tc.url, modelspec.Config{Arch: coordinator.ArchGPT, GPT: cfg}, coordinator.CheckpointStore{})
		if err == nil {
			got, err = runmodel.FromWeights(context.Background(), w, nil)
		}
		switch {
		case tc.err == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == nil && !slices.Equal(paramsOf(got), want.Params):
			t.Errorf("%s: other weights", tc.name)
		case tc.err != nil && !errors.Is(err, tc.err):
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.err)
		}
	}
	for _, url := range []string{"s3://bucket", "gs://bucket/model", "seed:x", "seed:-1"} {
		if _, err := n.loadURL(context.Background(), url, modelspec.Config{Arch: coordinator.ArchGPT, GPT: cfg}, coordinator.CheckpointStore{}); !errors.Is(err, modelspec.ErrSource) {
			t.Errorf("%s: %v, want modelspec.ErrSource", url, err)
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
			modelspec.SetGPT(&s.Model, cfg)
			s.Model.Checkpoint.Kind = coordinator.CheckpointHub
			_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.URL[:], url)
			_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.Revision[:], tc.revision)
			_ = coordinator.SetFixedString(s.Model.DataLocation[:], "builtin:opticks")
			seed := sha256.Sum256([]byte(tc.name))
			net := memnet.NewHub().Join("run", ed25519.NewKeyFromSeed(seed[:]), coordinator.Pubkey{1})
			n := &Node{cfg: config{log: slog.New(slog.DiscardHandler), workers: 1}, net: net}
			err := loadRecorded(context.Background(), n, s)
			switch {
			case !tc.refused && err != nil:
				t.Errorf("%s, %s: %v", url, tc.name, err)
			case !tc.refused && !slices.Equal(paramsOf(n.Model()), seeded.Params):
				t.Errorf("%s, %s: other weights", url, tc.name)
			case tc.refused:
				want := fmt.Sprintf("node: the model from %s has hash %s, the run records %s: refusing to train", url, hash, otherHash)
				if !errors.Is(err, weights.ErrRevision) || errors.Is(err, errLoadLater) || err.Error() != want {
					t.Errorf("%s, %s: %v, want %q (not to be retried)", url, tc.name, err, want)
				}
				if n.engine() != nil {
					t.Errorf("%s, %s: the refused model was kept", url, tc.name)
				}
			}
		}
	}
}

// TestRestartOnSeparateMachines: after a full restart the run's recorded
// checkpoint is a file on the disk of the trainer that wrote it. That
// trainer loads it and offers it; one that cannot read the path waits (a
// retryable error naming the URL) and then takes the offer, checked against
// the recorded hash; an offer of another model is refused and retried.
func TestRestartOnSeparateMachines(t *testing.T) {
	cfg := gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}
	recorded, _ := gpt.New(cfg, 5, nil)
	path := filepath.Join(t.TempDir(), "a", "checkpoint.safetensors")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := recorded.Save(context.Background(), path, nil); err != nil {
		t.Fatal(err)
	}
	url := "file://" + path
	hidden := path + ".elsewhere" // where B's machine "has" it: nowhere it looks
	hide := func() {
		if err := os.Rename(path, hidden); err != nil {
			t.Fatal(err)
		}
	}
	unhide := func() {
		if err := os.Rename(hidden, path); err != nil {
			t.Fatal(err)
		}
	}

	hub := memnet.NewHub()
	trainer := func(name string) (*Node, coordinator.ClientID) {
		key := sha256.Sum256([]byte("p2p " + name))
		signer := coordinator.Pubkey{name[0]}
		net := hub.Join("run", ed25519.NewKeyFromSeed(key[:]), signer)
		return &Node{cfg: config{log: slog.New(slog.DiscardHandler), workers: 1}, net: net},
			coordinator.ClientID{Signer: signer, P2P: net.ID()}
	}
	a, idA := trainer("A")
	b, idB := trainer("B")
	c, idC := trainer("C")
	d, idD := trainer("D")
	connect := func(x, y *Node) {
		if err := x.net.Connect(context.Background(), y.net.(*memnet.Node).Addrs()[0]); err != nil {
			t.Fatal(err)
		}
	}
	connect(b, a)
	connect(d, c)
	state := func(holders ...coordinator.ClientID) *coordinator.Coordinator {
		s := &coordinator.Coordinator{}
		s.Model = coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
			Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64}}
		modelspec.SetGPT(&s.Model, cfg)
		s.Model.Checkpoint.Kind = coordinator.CheckpointHub // what a full restart falls back to
		_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.URL[:], url)
		_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.Revision[:], runmodel.Revision(recorded))
		_ = coordinator.SetFixedString(s.Model.DataLocation[:], "builtin:opticks")
		s.Progress.Epoch = 3
		// The previous epoch's members, back for this one: they hold its
		// checkpoint (or, restarted, can be asked for it).
		for i, id := range holders {
			s.Epoch.Clients[i] = coordinator.Client{ID: id, State: coordinator.Healthy}
			s.Epoch.Exited[i] = coordinator.Client{ID: id, State: coordinator.Healthy}
		}
		s.Epoch.ClientsLen, s.Epoch.ExitedLen = uint16(len(holders)), uint16(len(holders))
		return s
	}
	s := state(idA, idB)

	// B first, before A has loaded: nothing to read here, nobody offers.
	hide()
	err := loadTry(context.Background(), b, idB, s)
	if !retryable(err) || !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), "cannot be read here") {
		t.Fatalf("B before any offer: %v, want a retryable error naming %s", err, url)
	}
	// A holds the file, loads it and offers it.
	unhide()
	if err := loadTry(context.Background(), a, idA, s); err != nil {
		t.Fatalf("A: %v", err)
	}
	// B still cannot read it, and now takes A's offer.
	hide()
	if err := loadTry(context.Background(), b, idB, s); err != nil {
		t.Fatalf("B after A's offer: %v", err)
	}
	if !slices.Equal(paramsOf(b.Model()), recorded.Params) {
		t.Fatal("B trains other weights than the recorded checkpoint")
	}

	// C offers another model as this epoch's: D, who cannot read the file
	// either, refuses it by the recorded hash and tries again later.
	other, _ := gpt.New(cfg, 6, nil)
	if err := c.offerModel(context.Background(), recordedOffer(3), other); err != nil {
		t.Fatal(err)
	}
	err = loadTry(context.Background(), d, idD, state(idC, idD))
	if !retryable(err) || !errors.Is(err, weights.ErrRevision) || d.engine() != nil {
		t.Fatalf("D offered another model: %v (model kept: %v), want a retryable revision error", err, d.engine() != nil)
	}
}
