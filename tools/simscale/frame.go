package simscale

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/llama"
)

// Llama1B is the parameter shapes of the Llama-3.2-1B shape that
// examples/llama-1b-run.toml trains (1.24B parameters).
func Llama1B() [][]int {
	c := llama.Config{Vocab: 128256, Context: 2048, Width: 2048, Layers: 16, Heads: 32, KVHeads: 8, Intermediate: 8192,
		RopeTheta: 500000, TiedHead: true}
	var out [][]int
	for _, s := range c.Specs() {
		out = append(out, s.Shape)
	}
	return out
}

// FrameSize is the size of one trainer's result for a model of these
// parameter shapes at DisTrO's chunk and top-k, 1-bit values and
// Rice-coded indices (what modelspec.Distro sends), computed by the frame
// encoding itself (distro.Frame.WireSize) on a frame whose kept
// coefficients are drawn uniformly in each tile, and the largest an honest
// frame of the model can be (distro.FrameBounds). Rice codes make the size
// depend on where the kept coefficients lie; uniform positions are the
// assumption.
func FrameSize(shapes [][]int, chunk, topk int, seed uint64) (typical, largest int64, err error) {
	_, largest, err = distro.FrameBounds(shapes, distro.Options{Chunk: chunk, TopK: topk, Quantize1Bit: true, RiceIndices: true})
	if err != nil {
		return 0, 0, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	f := &distro.Frame{}
	for _, shape := range shapes {
		// The tiling of distro's tensor plan: the last two dims (a 1-D
		// tensor is one row), each cut at its largest divisor ≤ chunk.
		outer, rows, cols := 1, 1, shape[len(shape)-1]
		for _, d := range shape[:max(len(shape)-2, 0)] {
			outer *= d
		}
		if len(shape) >= 2 {
			rows = shape[len(shape)-2]
		}
		th, tw := distro.LargestDivisor(rows, chunk), distro.LargestDivisor(cols, chunk)
		tiles := outer * (rows / th) * (cols / tw)
		k := min(topk, th*tw)
		t := distro.Tensor{Shape: slices.Clone(shape), TileH: th, TileW: tw, K: k, Quantized: true, RiceIndices: true,
			Indices: make([]uint32, 0, tiles*k), Values: make([]float32, tiles*k)}
		pick := make([]uint32, 0, k)
		for range tiles {
			pick = pick[:0]
			for len(pick) < k {
				i := uint32(rng.IntN(th * tw))
				if !slices.Contains(pick, i) {
					pick = append(pick, i)
				}
			}
			slices.Sort(pick)
			t.Indices = append(t.Indices, pick...)
		}
		for i := range t.Values {
			t.Values[i] = 1
		}
		f.Tensors = append(f.Tensors, t)
	}
	typical = int64(f.WireSize())
	if typical > largest {
		return 0, 0, fmt.Errorf("simscale: a typical frame (%d bytes) is larger than the bound (%d)", typical, largest)
	}
	return typical, largest, nil
}
