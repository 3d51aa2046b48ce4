package localrun_test

import (
	"context"
	"crypto/sha256"
	"testing"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/localrun"
)

// TestKeysKeepTheirNames: the derivations the node tests and psyche
// localnet have always used (which trainer witnesses which round depends
// on them), spelt out.
func TestKeysKeepTheirNames(t *testing.T) {
	for _, tc := range []struct {
		keys localrun.Keys
		got  *chain.Keypair
		name string
	}{
		{localrun.Keys{}, localrun.Keys{}.Admin(), "admin"},
		{localrun.Keys{}, localrun.Keys{}.Trainer(0), "trainer 0"},
		{localrun.Keys{Prefix: "localnet", Suffix: "run-1"}, localrun.Keys{Prefix: "localnet", Suffix: "run-1"}.Trainer(2), "localnet trainer 2 run-1"},
		{localrun.Keys{Prefix: "localnet"}, localrun.Keys{Prefix: "localnet"}.Admin(), "localnet admin"},
	} {
		if want := chain.KeypairFromSeed(sha256.Sum256([]byte(tc.name))); tc.got.Public() != want.Public() {
			t.Errorf("%+v: the key is not the one named %q", tc.keys, tc.name)
		}
	}
	k := localrun.Keys{}
	if id := k.ID(1); id.Signer != k.Trainer(1).Public() || id.P2P == (coordinator.Pubkey{}) || id.P2P == id.Signer {
		t.Errorf("ID(1) = %+v", id)
	}
}

// TestCreateStartsTheRun: a run defined here, with its files, is accepted
// by a real server and waits for its trainers.
func TestCreateStartsTheRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	srv, err := localrun.StartServer(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := srv.Wait(); err != nil {
			t.Errorf("server: %v", err)
		}
	})
	run := localrun.NewRun("lr", 3, 2, func(c *coordinator.Config, _ *coordinator.Model) { c.TotalSteps = 20 })
	run.Name = "a local run"
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i % 256)
	}
	files, err := localrun.WriteFiles(ctx, dir, &run.Model, tokens, 2, 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.UseFiles(files); err != nil {
		t.Fatal(err)
	}
	if err := localrun.Create(ctx, srv.Client, run, localrun.Keys{}.Admin()); err != nil {
		t.Fatal(err)
	}
	snap, err := srv.Client.Snapshot(ctx, "lr")
	if err != nil {
		t.Fatal(err)
	}
	s := snap.State
	if s.RunState != coordinator.WaitingForMembers || s.Config.TotalSteps != 20 || s.Config.GlobalBatchSizeStart != 6 ||
		s.Config.InitMinClients != 3 || coordinator.FixedString(s.Model.Checkpoint.Source.URL[:]) != "seed:7" ||
		coordinator.FixedString(s.Model.DataLocation[:]) != files.Tokens || coordinator.FixedString(s.Metadata.Name[:]) != "a local run" {
		t.Fatalf("the run as the server holds it: %s, config %+v, checkpoint %q, data %q, name %q", s.RunState, s.Config,
			coordinator.FixedString(s.Model.Checkpoint.Source.URL[:]), coordinator.FixedString(s.Model.DataLocation[:]),
			coordinator.FixedString(s.Metadata.Name[:]))
	}
}
