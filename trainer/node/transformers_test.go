package node_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/p2p/libp2p"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/localrun"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/node"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// TestTransformersJoinerLoadsFromPeers: three torch trainers train a
// Hugging Face model (the Qwen3 example's config); a fourth joins for the
// second epoch and fetches the model from them as named tensors, which its
// engine puts in transformers' order; all four end the epoch with the same
// weights. Virtual time, as newCluster: worker starts never race the run.
func TestTransformersJoinerLoadsFromPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run with torch workers")
	}
	op, err := torch.New()
	if err != nil {
		t.Fatal(err)
	}
	c := startServer(t, 15*time.Minute)
	keys := c.createQwen3Run(3, 200_000, func(k *coordinator.Config) {
		k.GlobalBatchSizeStart, k.GlobalBatchSizeEnd, k.MinClients = 6, 6, 2
	})
	c.run = localrun.NewTrainers("e2e", c.backend, keys, localrun.WithClock(c.clock), localrun.WithCheckpointDir(c.dir),
		localrun.WithLibp2pOptions(libp2p.WithFetchTimeout(5*time.Second)),
		localrun.WithTrainerOptions(func(i int) []node.Option {
			return []node.Option{node.WithLogger(testLogger(t, i)), node.WithEngine(op)}
		}))
	// Each leaves after the second epoch (the joiner after its first):
	// stopping a torch trainer takes seconds, in which the others would
	// train on into a third.
	c.addTrainers(0, 4, joinsSecond(3))
	warm := c.waitFor("the second epoch", func(s *coordinator.Coordinator) bool { return inEpoch(s, 1) })
	if warm.Model.Checkpoint.Kind != coordinator.CheckpointP2P || warm.Epoch.ClientsLen != 4 {
		t.Fatalf("epoch 1 starts with checkpoint %s and %d clients; want P2P and 4", warm.Model.Checkpoint.Kind, warm.Epoch.ClientsLen)
	}
	c.waitFor("the end of the second epoch", func(s *coordinator.Coordinator) bool {
		return s.Progress.Epoch >= 2 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1, 2, 3)
	for i := range 4 {
		t.Logf("trainer %d: hash %s", i, runmodel.Revision(c.nodes[i].Model()))
	}
	c.sameWeights(0, 1, 2, 3)
}

// TestGoTrainerRefusesTransformersRun: a trainer on the Go engine (the
// default of psyche join) asked to train a transformers run returns, before
// it joins, one line saying to join with --engine torch; the run never
// counts it among its joiners. No torch worker is started.
func TestGoTrainerRefusesTransformersRun(t *testing.T) {
	c := startServer(t, 5*time.Minute)
	keys := c.createQwen3Run(1, 20_000, func(k *coordinator.Config) { k.MinClients = 1 })
	c.run = localrun.NewTrainers("e2e", c.backend, keys, localrun.WithClock(c.clock), localrun.WithCheckpointDir(c.dir),
		localrun.WithTrainerOptions(func(i int) []node.Option { return []node.Option{node.WithLogger(testLogger(t, i))} }))
	c.addTrainers(0, 1)
	err := c.result(0)
	if err == nil || !strings.Contains(err.Error(), "refusing to join run e2e") || !strings.Contains(err.Error(), "--engine torch") ||
		strings.Contains(err.Error(), "\n") {
		t.Fatalf("a Go trainer on a transformers run: %v; want one line refusing to join, saying --engine torch", err)
	}
	t.Log(err)
	s, err := c.backend.Snapshot(c.ctx, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	if s.State.PendingLen != 0 || s.State.Epoch.ClientsLen != 0 || s.State.RunState != coordinator.WaitingForMembers {
		t.Fatalf("the run has %d pending joiners, %d clients, state %s: the refusing trainer joined", s.State.PendingLen,
			s.State.Epoch.ClientsLen, s.State.RunState)
	}
}

// createQwen3Run creates run e2e of the shipped tiny Qwen3 (its config.json
// copied into the cluster's directory; every trainer draws it from seed 1)
// for trainers, on the first corpus bytes of the bundled text (three
// quarters of them for training), and returns its keys.
func (c *cluster) createQwen3Run(trainers, corpus int, edit func(*coordinator.Config)) localrun.Keys {
	t := c.t
	t.Helper()
	config, err := os.ReadFile("../../examples/hf/qwen3-tiny.json")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.dir, "config.json")
	if err := os.WriteFile(path, config, 0o644); err != nil {
		t.Fatal(err)
	}
	run := localrun.NewRun("e2e", trainers, 1, func(k *coordinator.Config, m *coordinator.Model) {
		edit(k)
		f, err := modelspec.ParseTransformersFile(config)
		if err != nil {
			t.Fatal(err)
		}
		tc, err := f.Mirror(int(m.MaxSeqLen))
		if err != nil {
			t.Fatal(err)
		}
		modelspec.SetTransformers(m, tc)
		_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], modelspec.SeedConfigURL(1, path))
		_ = coordinator.SetFixedString(m.Checkpoint.Source.Revision[:], modelspec.ConfigHash(config))
	})
	c.tokens = data.Tokenize(data.Opticks()[:corpus])
	files, err := localrun.WriteFiles(c.ctx, c.dir, &run.Model, c.tokens[:corpus*3/4], 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := files.Initial.(*runmodel.Transformers); !ok {
		t.Fatalf("initial model %T", files.Initial)
	}
	if err := run.UseFiles(files); err != nil {
		t.Fatal(err)
	}
	keys := localrun.Keys{}
	c.admin = keys.Admin()
	if err := localrun.Create(c.ctx, c.backend, run, c.admin); err != nil {
		t.Fatal(err)
	}
	return keys
}
