package node

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/s3test"
	"github.com/psyche-go/psyche/internal/syncbuf"
	"github.com/psyche-go/psyche/p2p/memnet"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
	"github.com/psyche-go/psyche/trainer/store"
	"github.com/psyche-go/psyche/trainer/weights"
)

// TestStoreCheckpoints: an elected checkpointer's model goes to the run's
// bucket as a Hugging Face directory; after a full restart a trainer with
// the keys loads it from there (and keeps the files, which it offers), one
// whose keys the bucket refuses says so and takes that offer, and a model
// replaced in the bucket is refused by the recorded hash, naming both.
func TestStoreCheckpoints(t *testing.T) {
	srv := s3test.Start(t)
	srv.Bucket(t, "ckpt")
	// The trainers name the endpoint their keys are for: the run's.
	t.Setenv("PSYCHE_STORE_ENDPOINT", srv.Endpoint)
	setKeys := func(secret string) {
		t.Setenv("AWS_ACCESS_KEY_ID", s3test.AccessKey)
		t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	}
	setKeys(s3test.SecretKey)
	ctx := context.Background()
	cfg := gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}
	recorded, _ := gpt.New(cfg, 5, nil)
	rev := runmodel.Revision(recorded)

	var st coordinator.CheckpointStore
	_ = coordinator.SetFixedString(st.URL[:], "s3://ckpt/runs")
	_ = coordinator.SetFixedString(st.Endpoint[:], srv.Endpoint)

	hub := memnet.NewHub()
	logs := map[string]*syncbuf.Buffer{}
	trainer := func(name string) (*Node, coordinator.ClientID) {
		key := sha256.Sum256([]byte("p2p " + name))
		signer := coordinator.Pubkey{name[0]}
		net := hub.Join("run", ed25519.NewKeyFromSeed(key[:]), signer)
		logs[name] = &syncbuf.Buffer{}
		return &Node{runID: "run", cfg: config{log: slog.New(slog.NewTextHandler(logs[name], nil)), workers: 1, checkpoints: t.TempDir()}, net: net},
			coordinator.ClientID{Signer: signer, P2P: net.ID()}
	}

	// The checkpointer saves what saveCheckpoint saves for a store (a
	// GPT-2 directory) and uploads it.
	a, _ := trainer("A")
	dir := filepath.Join(a.cfg.checkpoints, "run-epoch2-step7")
	if err := recorded.SaveHF(ctx, dir); err != nil {
		t.Fatal(err)
	}
	url, err := a.uploadCheckpoint(ctx, store.FromRun(st), dir, 7)
	if err != nil {
		t.Fatal(err)
	}
	if url != "s3://ckpt/runs/run/step-7" {
		t.Fatalf("recorded URL %s", url)
	}
	if _, err := os.Stat(filepath.Join(srv.Root, "ckpt", "runs", "run", "step-7", "config.json")); err != nil {
		t.Fatalf("the bucket lacks config.json: %v", err)
	}

	state := func(holders ...coordinator.ClientID) *coordinator.Coordinator {
		s := &coordinator.Coordinator{}
		s.Model = coordinator.Model{Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
			Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.97, CompressionTopK: 12, CompressionChunk: 64}}
		modelspec.SetGPT(&s.Model, cfg)
		s.Model.Checkpoint.Kind = coordinator.CheckpointHub
		_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.URL[:], url)
		_ = coordinator.SetFixedString(s.Model.Checkpoint.Source.Revision[:], rev)
		_ = coordinator.SetFixedString(s.Model.DataLocation[:], "builtin:opticks")
		s.Model.Store = st
		s.Progress.Epoch = 3
		for i, id := range holders {
			s.Epoch.Clients[i] = coordinator.Client{ID: id, State: coordinator.Healthy}
			s.Epoch.Exited[i] = coordinator.Client{ID: id, State: coordinator.Healthy}
		}
		s.Epoch.ClientsLen, s.Epoch.ExitedLen = uint16(len(holders)), uint16(len(holders))
		return s
	}
	b, idB := trainer("B")
	c, idC := trainer("C")
	if err := c.net.Connect(ctx, b.net.(*memnet.Node).Addrs()[0]); err != nil {
		t.Fatal(err)
	}
	s := state(idB, idC)

	// C's keys are refused: it says which URL and waits for an offer, and
	// (checked as it loads, in the background) that the store will not
	// take its uploads.
	setKeys("not-the-secret")
	err = loadTry(ctx, c, idC, s)
	if !retryable(err) || !strings.Contains(err.Error(), url) {
		t.Fatalf("C with refused keys: %v, want a retryable error naming %s", err, url)
	}
	c.uploads.Wait()
	if l := logs["C"].String(); !strings.Contains(l, "checkpoint store cannot be used") || !strings.Contains(l, "credentials refused") {
		t.Errorf("C's log does not say its keys are refused by the store:\n%s", l)
	}
	// B has the keys: it loads the bucket's checkpoint and offers it.
	setKeys(s3test.SecretKey)
	if err := loadTry(ctx, b, idB, s); err != nil {
		t.Fatalf("B: %v", err)
	}
	b.uploads.Wait()
	if l := logs["B"].String(); !strings.Contains(l, "checkpoint store reachable") {
		t.Errorf("B's log does not say the store is reachable:\n%s", l)
	}
	if !slices.Equal(paramsOf(b.Model()), recorded.Params) {
		t.Fatal("B trains other weights than the recorded checkpoint")
	}
	if _, err := os.Stat(filepath.Join(b.cfg.checkpoints, "from-store", "ckpt_runs_run_step-7", "model.safetensors")); err != nil {
		t.Fatalf("B keeps no copy of the downloaded checkpoint: %v", err)
	}
	// C, keys still refused, takes B's offer.
	setKeys("not-the-secret")
	if err := loadTry(ctx, c, idC, s); err != nil {
		t.Fatalf("C after B's offer: %v", err)
	}
	if !slices.Equal(paramsOf(c.Model()), recorded.Params) {
		t.Fatal("C trains other weights than the recorded checkpoint")
	}

	// Someone with write access replaces the model in the bucket: a
	// trainer that downloads it refuses it by the recorded hash, naming
	// both, and waits for an offer instead.
	setKeys(s3test.SecretKey)
	other, _ := gpt.New(cfg, 6, nil)
	tampered := t.TempDir()
	if err := other.SaveHF(ctx, tampered); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(srv.Root, "ckpt", "runs", "run", "step-7", "model.safetensors"),
		must(os.ReadFile(filepath.Join(tampered, "model.safetensors"))), 0o644); err != nil {
		t.Fatal(err)
	}
	d, idD := trainer("D")
	err = loadTry(ctx, d, idD, state(idD))
	d.uploads.Wait()
	if !retryable(err) || !errors.Is(err, weights.ErrRevision) || d.engine() != nil ||
		!strings.Contains(err.Error(), rev) || !strings.Contains(err.Error(), runmodel.Revision(other)) {
		t.Fatalf("D loading a replaced model: %v (model kept: %v), want a retryable error naming hashes %s and %s",
			err, d.engine() != nil, rev, runmodel.Revision(other))
	}
}

// TestStoreEndpointGetsNoCredentials: the run's endpoint is the run
// creator's choice. A joiner whose keys (a session token too) are in its
// environment and that did not name that endpoint sends them nowhere: not in
// its background store check, not when it downloads a recorded s3://
// checkpoint, not when it uploads one; and an endpoint on its own loopback
// gets no request at all.
func TestStoreEndpointGetsNoCredentials(t *testing.T) {
	var mu sync.Mutex
	var requests int
	var signed []string
	run := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		requests++
		for _, h := range []string{"Authorization", "X-Amz-Security-Token"} {
			if v := r.Header.Get(h); v != "" {
				signed = append(signed, h+": "+v)
			}
		}
	}))
	defer run.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIATRAINERSOWNKEY")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "trainers-own-secret")
	t.Setenv("AWS_SESSION_TOKEN", "trainers-session-token")
	t.Setenv("PSYCHE_STORE_ENDPOINT", "")
	t.Setenv("PSYCHE_STORE_ALLOW_HTTP", "1") // even so

	var st coordinator.CheckpointStore
	_ = coordinator.SetFixedString(st.URL[:], "s3://ckpt/runs")
	_ = coordinator.SetFixedString(st.Endpoint[:], run.URL)
	_ = coordinator.SetFixedString(st.Region[:], "us-east-1")
	var log syncbuf.Buffer
	n := &Node{runID: "run", cfg: config{log: slog.New(slog.NewTextHandler(&log, nil)), workers: 1, checkpoints: t.TempDir()}}
	ctx := context.Background()
	n.checkStore(ctx, st)
	n.uploads.Wait()
	cfg := gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}
	_, errDownload := n.downloadCheckpoint(ctx, "s3://ckpt/runs/run/step-1", modelspec.Config{Arch: coordinator.ArchGPT, GPT: cfg}, st)
	model, _ := gpt.New(cfg, 5, nil)
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := model.SaveHF(ctx, dir); err != nil {
		t.Fatal(err)
	}
	_, errUpload := n.uploadCheckpoint(ctx, store.FromRun(st), dir, 1)

	mu.Lock()
	defer mu.Unlock()
	if len(signed) != 0 {
		t.Fatalf("the run's endpoint received this trainer's credentials:\n%s", strings.Join(signed, "\n"))
	}
	if requests != 0 {
		t.Errorf("the run's endpoint on this trainer's loopback got %d requests", requests)
	}
	if !strings.Contains(log.String(), "endpoint refused") {
		t.Errorf("the store check does not say the endpoint is refused:\n%s", log.String())
	}
	if errDownload == nil || errUpload == nil {
		t.Errorf("download: %v; upload: %v; want both refused", errDownload, errUpload)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
