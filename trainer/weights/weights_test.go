package weights

import (
	"strings"
	"testing"
)

// TestMatchTensors: a checkpoint's tensors against those transformers
// builds, each difference said in one line naming the first tensor and how
// many more there are.
func TestMatchTensors(t *testing.T) {
	names, shapes := []string{"embed.weight", "a.weight", "b.weight"}, [][]int{{8, 4}, {4, 4}, {4}}
	if err := MatchTensors([]string{"b.weight", "a.weight", "embed.weight"}, [][]int{{4}, {4, 4}, {8, 4}}, names, shapes); err != nil {
		t.Fatalf("the same tensors in another order: %v", err)
	}
	for _, tt := range []struct {
		name       string
		haveNames  []string
		haveShapes [][]int
		want       string
	}{
		{"missing", []string{"embed.weight"}, [][]int{{8, 4}}, "has no tensor a.weight [4 4], which transformers builds from the config (and 1 more missing)"},
		{"misshapen", []string{"embed.weight", "a.weight", "b.weight"}, [][]int{{8, 4}, {4, 4}, {5}}, "tensor b.weight is [5] in the checkpoint, transformers builds it [4] from the config"},
		{"extra", []string{"embed.weight", "a.weight", "b.weight", "lm_head.weight"}, [][]int{{8, 4}, {4, 4}, {4}, {8, 4}},
			"the checkpoint's tensor lm_head.weight [8 4] is not one transformers builds from the config"},
	} {
		err := MatchTensors(tt.haveNames, tt.haveShapes, names, shapes)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line with %q", tt.name, err, tt.want)
		}
	}
}
