package fedclient_test

import (
	"context"
	"crypto/sha256"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/dp"
	"github.com/psyche-go/psyche/federated/fedclient"
	"github.com/psyche-go/psyche/federated/fedserver"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// newSigner is the key pair a name stands for, the same in every run of the
// tests (chain.Keypair already signs as federated.Signer asks).
func newSigner(name string) *chain.Keypair {
	return chain.KeypairFromSeed(sha256.Sum256([]byte(name)))
}

// TestParticipateWithLocalDP: one client of a run with local differential
// privacy (clip 0.5, σ = 1) trains three rounds through the real service;
// the server reports each client's ε for three rounds of the Gaussian
// mechanism, and no central guarantee (it adds no noise).
func TestParticipateWithLocalDP(t *testing.T) {
	ctx := context.Background()
	admin := newSigner("admin")
	shape := gpt.Config{Vocab: 256, Context: 16, Width: 16, Layers: 1, Heads: 2}
	acct := new(coordinator.Coordinator)
	acct.MainAuthority = admin.Public()
	acct.RunState = coordinator.WaitingForMembers
	modelspec.SetGPT(&acct.Model, shape)
	if err := coordinator.SetFixedString(acct.Model.Checkpoint.Source.URL[:], "seed:3"); err != nil {
		t.Fatal(err)
	}
	accounts := func(id string) ([]byte, bool) { return acct.MarshalAccount(), id == "ldp" }
	svc, err := fedserver.New(t.TempDir(), accounts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	svc.Routes(mux)
	hs := httptest.NewServer(mux)
	defer hs.Close()
	cfg := &federated.Config{Capacity: 1, RoundDuration: 2, Clip: 0.5, LocalNoiseMultiplier: 1}
	if _, err := fedclient.New(hs.URL, "ldp", admin).Configure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "local.txt")
	if err := os.WriteFile(file, data.Opticks()[:4000], 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := fedclient.LoadLocalData(file, shape.Context)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := fedclient.NewTrainer(shape, d, 2, shape.Context, 1e-3, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := fedclient.New(hs.URL, "ldp", newSigner("client"))
	_, before, _ := c.Model(ctx, -1)
	var reports []fedclient.Round
	if err := fedclient.Participate(ctx, c, tr, fedclient.Options{Rounds: 3, OnRound: func(r fedclient.Round) { reports = append(reports, r) }}); err != nil {
		t.Fatal(err)
	}
	if len(reports) != 4 || reports[3].Round != 3 {
		t.Fatalf("reports: %+v", reports)
	}
	_, after, _ := c.Model(ctx, -1)
	var moved float64
	for i := range after {
		moved += float64(after[i]-before[i]) * float64(after[i]-before[i])
	}
	// Three clipped updates plus noise of σ·C = 0.5 per value: the model
	// moved by about 0.5·√(3n).
	if want := 0.5 * math.Sqrt(3*float64(len(after))); math.Abs(math.Sqrt(moved)-want) > 0.2*want {
		t.Fatalf("the model moved by %.2f, want about %.2f (local noise)", math.Sqrt(moved), want)
	}
	in, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := dp.Accountant{Q: 1, Sigma: 1}.Spent(3, 1e-5)
	if in.Epsilon != nil || in.EpsilonLocal == nil || math.Abs(*in.EpsilonLocal-want) > 1e-9 {
		t.Fatalf("privacy reported: central %v, local %v (want %v)", in.Epsilon, in.EpsilonLocal, want)
	}
}
