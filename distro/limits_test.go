package distro

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func randomGrads(shapes [][]int, seed uint64) [][]float32 {
	return randomTensors(rand.New(rand.NewPCG(seed, 1)), shapes, 1)
}

// worstFrame is the longest frame the model allows: every tile's indices
// are its last k (the largest first gap Rice can meet).
func worstFrame(d *DeMo) *Frame {
	f := &Frame{}
	for _, p := range d.plans {
		t := Tensor{Shape: p.shape, TileH: p.th, TileW: p.tw, K: p.k, Quantized: d.opts.Quantize1Bit, RiceIndices: d.opts.RiceIndices}
		for range p.tiles() {
			for j := p.tileSize() - p.k; j < p.tileSize(); j++ {
				t.Indices = append(t.Indices, uint32(j))
				t.Values = append(t.Values, 1)
			}
		}
		f.Tensors = append(f.Tensors, t)
	}
	return f
}

// Every frame of a model, honest or the longest possible, fits the model's
// limits and its maximum size; a frame of a bigger model does not.
func TestModelLimits(t *testing.T) {
	for _, o := range []Options{
		{Chunk: 16, TopK: 4},
		{Chunk: 16, TopK: 4, Quantize1Bit: true},
		{Chunk: 64, TopK: 32, Quantize1Bit: true, RiceIndices: true},
		{Chunk: 8, TopK: 64, RiceIndices: true},
		{Chunk: 64, TopK: 1, RiceIndices: true},
	} {
		d, err := NewDeMo(testShapes(), o)
		if err != nil {
			t.Fatal(err)
		}
		honest, err := d.Step(randomGrads(testShapes(), 1), 0.01)
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range map[string]*Frame{"honest": honest, "worst": worstFrame(d)} {
			wire, err := f.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(wire)) > d.MaxFrameBytes() {
				t.Errorf("%+v %s: %d bytes, over MaxFrameBytes %d", o, name, len(wire), d.MaxFrameBytes())
			}
			g, err := DecodeFrame(wire, d.Limits())
			if err != nil {
				t.Errorf("%+v %s: decoding within the model's limits: %v", o, name, err)
				continue
			}
			if err := d.Check(g); err != nil {
				t.Errorf("%+v %s: %v", o, name, err)
			}
		}
		bigger, err := NewDeMo(append(testShapes(), []int{128, 128}), o)
		if err != nil {
			t.Fatal(err)
		}
		big, _ := worstFrame(bigger).MarshalBinary()
		if _, err := DecodeFrame(big, d.Limits()); !errors.Is(err, ErrFrameLimit) {
			t.Errorf("%+v: a bigger model's frame: %v, want ErrFrameLimit", o, err)
		}
	}
}

// A 1-bit run refuses float frames (one peer could carry any magnitude) and
// a float run refuses sign frames.
func TestCheckQuantization(t *testing.T) {
	signs, _ := NewDeMo(testShapes(), Options{Chunk: 16, TopK: 4, Quantize1Bit: true})
	floats, _ := NewDeMo(testShapes(), Options{Chunk: 16, TopK: 4})
	f, err := floats.Step(randomGrads(testShapes(), 2), 0.01)
	if err != nil {
		t.Fatal(err)
	}
	for i := range f.Tensors {
		for j := range f.Tensors[i].Values {
			f.Tensors[i].Values[j] = 1e30
		}
	}
	if err := signs.Check(f); !errors.Is(err, ErrMismatch) {
		t.Errorf("a float frame in a 1-bit run: %v, want ErrMismatch", err)
	}
	s, err := signs.Step(randomGrads(testShapes(), 3), 0.01)
	if err != nil {
		t.Fatal(err)
	}
	if err := floats.Check(s); !errors.Is(err, ErrMismatch) {
		t.Errorf("a sign frame in a float run: %v, want ErrMismatch", err)
	}
	if err := signs.Check(s); err != nil {
		t.Errorf("an honest sign frame: %v", err)
	}
}
