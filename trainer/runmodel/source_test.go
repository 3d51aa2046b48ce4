package runmodel

import (
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/weights"
)

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
	if _, err := Init(&m, 7, nil); !errors.Is(err, modelspec.ErrArchitecture) {
		t.Fatalf("Init of an unknown architecture = %v", err)
	}
}

func TestRevision(t *testing.T) {
	m := runModel()
	model, _ := Init(&m, 1, nil)
	rev := Revision(model)
	sum := model.Hash()
	if !weights.IsHash(rev) || rev != hex.EncodeToString(sum[:16]) {
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
		var re *weights.RevisionError
		if !errors.Is(err, weights.ErrRevision) || !errors.As(err, &re) || err.Error() != want {
			t.Errorf("%s: %v, want %q", tt.name, err, want)
		}
	}
}
