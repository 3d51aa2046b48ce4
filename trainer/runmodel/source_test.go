package runmodel

import (
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/trainer/gpt"
)

func TestParseSource(t *testing.T) {
	for _, tt := range []struct {
		url  string
		want Source
	}{
		{"seed:0", Source{Kind: FromSeed, Seed: 0}},
		{"seed:1", Source{Kind: FromSeed, Seed: 1}},
		{"seed:18446744073709551615", Source{Kind: FromSeed, Seed: 1<<64 - 1}},
		{"file:///var/lib/init.safetensors", Source{Kind: FromFile, Path: "/var/lib/init.safetensors"}},
		{"http://h/m.safetensors", Source{Kind: FromHTTP}},
		{"https://h/m.safetensors", Source{Kind: FromHTTP}},
		{"s3://bucket/runs/tiny/step-7", Source{Kind: FromS3}},
		{"s3://bucket/m.safetensors", Source{Kind: FromS3}},
	} {
		tt.want.URL = tt.url
		if got, err := ParseSource(tt.url); err != nil || got != tt.want {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", tt.url, got, err, tt.want)
		}
	}
	for _, url := range []string{"", "seed:", "seed:-1", "seed:+1", "seed:01", "seed:0x10", "seed:18446744073709551616",
		"seed: 1", "file://", "s3://bucket", "s3://bucket/", "s3:///key", "gs://bucket/m", "/var/lib/init.safetensors"} {
		if _, err := ParseSource(url); !errors.Is(err, ErrSource) {
			t.Errorf("ParseSource(%q) = %v, want ErrSource", url, err)
		}
	}
	if got := SeedURL(42); got != "seed:42" {
		t.Errorf("SeedURL(42) = %q", got)
	}
}

func TestInit(t *testing.T) {
	m := runModel()
	got, err := Init(&m, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := gpt.New(small, 7, nil)
	if g, ok := got.(*gpt.Model); !ok || g.Config != small || !slices.Equal(g.Params, want.Params) {
		t.Fatal("Init is not gpt.New with the run's config")
	}
	m.Architecture = 9
	if _, err := Init(&m, 7, nil); !errors.Is(err, ErrArchitecture) {
		t.Fatalf("Init of an unknown architecture = %v", err)
	}
}

func TestRevision(t *testing.T) {
	m := runModel()
	model, _ := Init(&m, 1, nil)
	rev := Revision(model)
	sum := model.Hash()
	if !IsHash(rev) || rev != hex.EncodeToString(sum[:16]) {
		t.Fatalf("Revision = %q (hash %x)", rev, sum)
	}
	other, _ := Init(&m, 2, nil)
	for _, tt := range []struct {
		name, revision string
		model          Model
		mismatch       bool
	}{
		{"match", rev, model, false},
		{"mismatch", rev, other, true},
		{"no revision", "", other, false},
		{"a label", "v1", other, false},
		{"upper case hex is a label", strings.ToUpper(rev), other, false},
		{"31 digits is a label", rev[:31], other, false},
		{"33 digits is a label", rev + "0", other, false},
	} {
		err := CheckRevision(tt.model, "seed:1", tt.revision)
		if !tt.mismatch {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		want := "the model from seed:1 has hash " + Revision(other) + ", the run records " + rev
		var re *RevisionError
		if !errors.Is(err, ErrRevision) || !errors.As(err, &re) || err.Error() != want {
			t.Errorf("%s: %v, want %q", tt.name, err, want)
		}
	}
}
