package main

import (
	"encoding/hex"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/dp"
)

// TestFederatedSection reads the run file's [federated] section: the
// example's, the run's aggregation rule as the default, target_epsilon
// turned into a noise multiplier, and the errors that name the key.
func TestFederatedSection(t *testing.T) {
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "federated-run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		replace []string // old, new, ...
		check   func(*testing.T, *federated.Config)
		err     string
	}{
		{name: "example", check: func(t *testing.T, c *federated.Config) {
			if c.Capacity != 3 || c.RoundDuration != 10 || c.Aggregation != federated.Mean || c.SecAgg || c.Clip != 10 {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "clip left out", replace: []string{"\nclip = 10.0", "\n"}, check: func(t *testing.T, c *federated.Config) {
			if c.Clip != federated.DefaultClip {
				t.Fatalf("clip %v, want the default %v", c.Clip, federated.DefaultClip)
			}
		}},
		{name: "clip turned off", replace: []string{"\nclip = 10.0", "\nclip = 0"}, check: func(t *testing.T, c *federated.Config) {
			if c.Clip != 0 {
				t.Fatalf("clip %v, want 0", c.Clip)
			}
		}},
		{name: "server_lr bound", replace: []string{"server_lr = 1.0 ", "server_lr = 1000.0 "}, err: "server_lr = 1000: want at most 100"},
		{name: "robust from the model section", replace: []string{`aggregation = "mean"`, `aggregation = "robust"`},
			check: func(t *testing.T, c *federated.Config) {
				if c.Aggregation != federated.Median {
					t.Fatalf("aggregation %v", c.Aggregation)
				}
			}},
		{name: "target epsilon", replace: []string{"rounds = 0 ", "rounds = 20 ", "clip = 10.0", "clip = 1.0", "\nnoise_multiplier = 0.0", "\ntarget_epsilon = 8.0"},
			check: func(t *testing.T, c *federated.Config) {
				eps, _, _ := dp.Accountant{Q: 1, Sigma: float64(c.NoiseMultiplier)}.Spent(20, 1e-5)
				if math.Abs(eps-8) > 0.01 {
					t.Fatalf("σ=%v gives ε=%v", c.NoiseMultiplier, eps)
				}
			}},
		{name: "target epsilon needs rounds", replace: []string{"\nnoise_multiplier = 0.0", "\ntarget_epsilon = 8.0"}, err: "needs rounds > 0"},
		{name: "mode", replace: []string{`mode = "federated"`, `mode = "decentralized"`}, err: `federated.mode = "decentralized"`},
		{name: "secagg needs clip", replace: []string{"secagg = false", "secagg = true", "secagg_threshold = 0 ", "secagg_threshold = 2 ", "clip = 10.0", "clip = 0.0"}, err: "secure aggregation needs clip > 0"},
		{name: "noise needs clip", replace: []string{"\nnoise_multiplier = 0.0", "\nnoise_multiplier = 1.0", "clip = 10.0", "clip = 0.0"}, err: "noise needs clip > 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := strings.NewReplacer(tc.replace...).Replace(string(example))
			if len(tc.replace) > 0 && text == string(example) {
				t.Fatal("the replacement changed nothing")
			}
			path := filepath.Join(t.TempDir(), "run.toml")
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := loadRunFile(path); err != nil {
				t.Fatalf("the coordinator's sections: %v", err)
			}
			c, err := loadFederated(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// TestFederatedToken: the join authority's token, as psyche federated-token
// prints it, is what the service accepts for that key in that run and no
// other; psyche join refuses a token that is not one.
func TestFederatedToken(t *testing.T) {
	dir := t.TempDir()
	authority, client := filepath.Join(dir, "authority.json"), filepath.Join(dir, "client.json")
	for _, k := range []string{authority, client} {
		var out, errb strings.Builder
		if code := run([]string{"psyche", "keygen", "--out", k}, &out, &errb); code != 0 {
			t.Fatalf("keygen: %s", errb.String())
		}
	}
	ak, err := chain.LoadKeypair(authority)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := chain.LoadKeypair(client)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	if code := run([]string{"psyche", "federated-token", "--authority-key", authority, "--run-id", "fed", "--client", ck.Public().String()}, &out, &errb); code != 0 {
		t.Fatalf("federated-token: %s", errb.String())
	}
	token, err := hex.DecodeString(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("%q: %v", out.String(), err)
	}
	if !federated.VerifyJoinToken(ak.Public(), "fed", ck.Public(), token) {
		t.Fatal("the printed token does not verify")
	}
	if federated.VerifyJoinToken(ak.Public(), "other", ck.Public(), token) || federated.VerifyJoinToken(ak.Public(), "fed", ak.Public(), token) {
		t.Fatal("the token verifies for another run or key")
	}
	errb.Reset()
	if code := run([]string{"psyche", "join", "--key", client, "--run-id", "fed", "--server", "http://127.0.0.1:1", "--local-data", authority,
		"--join-token", "abc"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "--join-token") {
		t.Fatalf("a malformed token: exit %d, %s", code, errb.String())
	}
}
