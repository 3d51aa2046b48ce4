package modelspec

import (
	"slices"
	"testing"
)

// TestPiecesCoverEveryValueOnce: every checkpoint layout cuts the
// parameters into pieces that fit their tensors and hold every value
// exactly once, so a file written piece by piece is the whole model.
func TestPiecesCoverEveryValueOnce(t *testing.T) {
	gpt := GPTConfig{Vocab: 11, Context: 6, Width: 8, Layers: 2, Heads: 2}
	llama := LlamaConfig{Vocab: 11, Context: 6, Width: 16, Layers: 3, Heads: 4, KVHeads: 2, Intermediate: 12, RopeTheta: 10000}
	tied := llama
	tied.TiedHead, tied.KVHeads = true, 4
	for _, tc := range []struct {
		name   string
		pieces []Piece
		shapes [][]int
	}{
		{"gpt", gpt.Pieces(), gpt.Shapes()},
		{"gpt hf", gpt.HFPieces(), gpt.Shapes()},
		{"llama", llama.Pieces(), llama.Shapes()},
		{"llama tied", tied.Pieces(), tied.Shapes()},
		{"whole", WholePieces([]string{"a", "b"}, [][]int{{2, 3}, {4}}), [][]int{{2, 3}, {4}}},
	} {
		if err := CheckPieces(tc.pieces, tc.shapes); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		seen := make([][]int, len(tc.shapes))
		for i, s := range tc.shapes {
			seen[i] = make([]int, Size(s))
		}
		names := map[string]bool{}
		for _, p := range tc.pieces {
			if names[p.Name] {
				t.Fatalf("%s: %s twice", tc.name, p.Name)
			}
			names[p.Name] = true
			for j := range Size(p.Shape) {
				seen[p.Tensor][p.Offset+j]++
			}
		}
		for i, s := range seen {
			if k := slices.IndexFunc(s, func(n int) bool { return n != 1 }); k >= 0 {
				t.Fatalf("%s: value %d of tensor %d is in %d pieces", tc.name, k, i, s[k])
			}
		}
	}
}

// TestPieceValues: a piece is a view of its tensor, or its transpose.
func TestPieceValues(t *testing.T) {
	params := [][]float32{{0, 1, 2, 3, 4, 5, 6, 7}}
	view := Piece{Name: "v", Shape: []int{3}, Tensor: 0, Offset: 2}
	if got := view.Values(params); !slices.Equal(got, []float32{2, 3, 4}) || &got[0] != &params[0][2] {
		t.Fatalf("view = %v", got)
	}
	// Rows 0..1 of a 2×3 matrix at offset 2 (2 3 4 / 5 6 7), stored 3×2.
	tr := Piece{Name: "t", Shape: []int{3, 2}, Tensor: 0, Offset: 2, Transposed: true}
	if got := tr.Values(params); !slices.Equal(got, []float32{2, 5, 3, 6, 4, 7}) {
		t.Fatalf("transposed = %v", got)
	}
	for _, bad := range []Piece{
		{Name: "past", Shape: []int{4}, Tensor: 0, Offset: 5},
		{Name: "tensor", Shape: []int{1}, Tensor: 1},
		{Name: "rank", Shape: []int{8}, Transposed: true},
	} {
		if err := CheckPieces([]Piece{bad}, [][]int{{8}}); err == nil {
			t.Errorf("%s: accepted", bad.Name)
		}
	}
}
