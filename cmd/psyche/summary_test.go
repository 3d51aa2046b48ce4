package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// TestReportWeights: localnet's summary says, per engine, whether that
// engine's trainers hold identical weights (they must), and how far the
// engines differ against the bound rounding allows, so that a mixed run
// that differs by rounding does not read as a failure (it printed
// "trainers hold identical weights: false", comparing a Go trainer's
// weights with a torch trainer's).
func TestReportWeights(t *testing.T) {
	cfg := gpt.Config{Vocab: 16, Context: 4, Width: 8, Layers: 1, Heads: 2}
	// model is the seed's model with n parameters moved by by.
	model := func(n int, by float32) runmodel.Model {
		m, err := gpt.New(cfg, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		w := m.Tensors()[0]
		for i := range n {
			w[i] += by
		}
		return m
	}
	same := model(0, 0)
	params := same.NumParams()
	hash := runmodel.Revision(same)
	for _, tc := range []struct {
		name string
		held []heldModel
		want []string
	}{
		{"one engine", []heldModel{{"go", same}, {"go", model(0, 0)}, {"go", model(0, 0)}},
			[]string{"trainers hold identical weights: true (go: 3 trainers, hash " + hash + ")"}},
		{"a mixed run within rounding", []heldModel{{"go", model(2, 1e-3)}, {"torch", same}, {"torch", model(0, 0)}},
			[]string{
				"trainers hold identical weights: true (go: 1 trainer, hash ",
				"trainers hold identical weights: true (torch: 2 trainers, hash " + hash + ")",
				"engines go and torch: 2 of " + strconv.Itoa(params) + " parameters differ (", "the largest by 0.001: within the bound of 1% of parameters that rounding allows",
			}},
		{"trainers of one engine apart", []heldModel{{"torch", same}, {"torch", model(3, 0.5)}},
			[]string{"trainers hold identical weights: false (torch: 2 trainers; 3 of " + strconv.Itoa(params) + " parameters differ (", "the largest by 0.5)"}},
		{"a trainer without a model", []heldModel{{"go", same}, {"go", nil}},
			[]string{"trainers hold identical weights: false (go: 2 trainers; a trainer holds no model)"}},
		{"engines drifted apart", []heldModel{{"go", model(params/50, 0.25)}, {"torch", same}},
			[]string{"engines go and torch: " + strconv.Itoa(params/50) + " of ", "beyond the bound of 1% of parameters that rounding allows"}},
		{"engines alike", []heldModel{{"go", same}, {"torch", model(0, 0)}},
			[]string{"engines go and torch: identical weights (" + strconv.Itoa(params) + " parameters)\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			reportWeights(&out, tc.held)
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("lacks %q:\n%s", w, out.String())
				}
			}
			// One line per engine that says true or false, for the
			// scripts that count them.
			engines := map[string]bool{}
			for _, h := range tc.held {
				engines[h.engine] = true
			}
			if n := strings.Count(out.String(), "trainers hold identical weights: "); n != len(engines) {
				t.Errorf("%d lines for %d engines:\n%s", n, len(engines), out.String())
			}
		})
	}
}
