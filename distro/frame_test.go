package distro

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

func sampleFrames(tb testing.TB) [][]byte {
	r := rand.New(rand.NewPCG(4, 4))
	var out [][]byte
	for _, o := range []Options{
		{Chunk: 16, TopK: 4, Quantize1Bit: true, Decay: 0.9},
		{Chunk: 16, TopK: 3, Decay: 0.9},
		{Chunk: 4, TopK: 16, Quantize1Bit: true},
		{Chunk: 512, TopK: 5},
		{Chunk: 16, TopK: 4, Quantize1Bit: true, RiceIndices: true},
		{Chunk: 4, TopK: 16, RiceIndices: true},
		{Chunk: 512, TopK: 5, RiceIndices: true},
	} {
		shapes := [][]int{{32, 32}, {20}, {2, 3, 4, 8}}
		if o.Chunk == 512 {
			shapes = [][]int{{300, 300}} // tiles of 300×300 use 4-byte indices
		}
		d, err := NewDeMo(shapes, o)
		if err != nil {
			tb.Fatal(err)
		}
		f, err := d.Step(randomTensors(r, shapes, 1), 0.1)
		if err != nil {
			tb.Fatal(err)
		}
		if len(out)%2 == 1 { // every other frame carries its sequences' losses
			f.Losses = []float32{3.25, 0, float32(r.Float64() * 10)}
		}
		b, err := f.MarshalBinary()
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func TestFrameRoundTrip(t *testing.T) {
	for _, b := range sampleFrames(t) {
		f, err := DecodeFrame(b, DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		again, err := f.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, b) {
			t.Fatal("re-encoding differs")
		}
		if f.WireSize() != len(b) {
			t.Fatalf("WireSize %d, encoded %d", f.WireSize(), len(b))
		}
		g, _ := DecodeFrame(again, DefaultLimits)
		if !reflect.DeepEqual(f, g) {
			t.Fatal("decoded frames differ")
		}
	}
}

// tensorOffset is where the first tensor's header starts, and its entries.
const firstTensor = 8

func TestDecodeFrameRejects(t *testing.T) {
	// A single 1-D tensor of 16 with tiles of 8, k=2, float values: 2 tiles.
	// Header at 8: ndim 1, flags 0, tile height 1, tile width 8, k 2, dim 16
	// (one byte each), then 4 one-byte indices and 4 float32 values.
	good := (&Frame{Tensors: []Tensor{{Shape: []int{16}, TileH: 1, TileW: 8, K: 2,
		Indices: []uint32{1, 5, 0, 7}, Values: []float32{0.5, -1, 2, 3}}}}).mustMarshal(t)
	const tileH, tileW, kAt, dimAt = firstTensor + 2, firstTensor + 3, firstTensor + 4, firstTensor + 5
	idxAt := firstTensor + 6
	valAt := idxAt + 4
	if len(good) != valAt+16 {
		t.Fatalf("frame of %d bytes, want %d", len(good), valAt+16)
	}
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	setByte := func(at int, v byte) []byte { return mutate(func(b []byte) []byte { b[at] = v; return b }) }
	setU32 := func(at int, v uint32) []byte {
		return mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[at:], v); return b })
	}
	// replace swaps the one-byte field at `at` for the given bytes.
	replace := func(at int, field ...byte) []byte {
		return mutate(func(b []byte) []byte { return append(append(b[:at:at], field...), good[at+1:]...) })
	}
	nan := math.Float32bits(float32(math.NaN()))
	inf := math.Float32bits(float32(math.Inf(1)))
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrFrame},
		{"magic", setByte(0, 'X'), ErrFrame},
		{"version", setByte(4, FrameVersion+1), ErrFrame},
		{"unknown frame flags", setByte(5, 2), ErrFrame},
		{"losses flag without losses", setByte(5, 1), ErrFrame},
		{"truncated", good[:len(good)-1], ErrFrame},
		{"truncated header", good[:dimAt], ErrFrame},
		{"trailing", append(bytes.Clone(good), 0), ErrFrame},
		{"no dims", setByte(firstTensor, 0), ErrFrame},
		{"too many dims", setByte(firstTensor, 9), ErrFrame},
		{"flags", setByte(firstTensor+1, 4), ErrFrame},
		{"tile does not divide", setByte(tileW, 5), ErrFrame},
		{"1-D with tile height", setByte(tileH, 2), ErrFrame},
		{"k zero", setByte(kAt, 0), ErrFrame},
		{"k above tile", setByte(kAt, 9), ErrFrame},
		{"zero dim", setByte(dimAt, 0), ErrFrame},
		{"shape mismatch", setByte(dimAt, 24), ErrFrame},
		{"overlong varint", replace(dimAt, 0x90, 0x00), ErrFrame},
		{"varint beyond 32 bits", replace(dimAt, 0x80, 0x80, 0x80, 0x80, 0x10), ErrFrame},
		{"unterminated varint", mutate(func(b []byte) []byte { return append(b[:dimAt:dimAt], 0x80) }), ErrFrame},
		{"index out of tile", setByte(idxAt+1, 8), ErrFrame},
		{"index not ascending", mutate(func(b []byte) []byte { b[idxAt], b[idxAt+1] = 5, 1; return b }), ErrFrame},
		{"duplicate index", setByte(idxAt+1, 1), ErrFrame},
		{"NaN", setU32(valAt, nan), ErrFrame},
		{"Inf", setU32(valAt+4, inf), ErrFrame},
		{"beyond MaxValue", setU32(valAt+8, math.Float32bits(math.Nextafter32(MaxValue, math.MaxFloat32))), ErrFrame},
		{"minus float32's maximum", setU32(valAt+12, math.Float32bits(-math.MaxFloat32)), ErrFrame},
		{"too many tensors", mutate(func(b []byte) []byte { b[6], b[7] = 0xff, 0xff; return b }), ErrFrameLimit},
		{"huge tensor", replace(dimAt, 0xf8, 0xff, 0xff, 0xff, 0x07), ErrFrameLimit}, // 2^31 − 8
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := DefaultLimits
			lim.MaxParams = 1 << 20
			_, err := DecodeFrame(tc.data, lim)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestDecodeFrameLosses: a frame's sequence losses round-trip, and the
// decoder refuses a section that is empty, over the caller's limit,
// truncated, or holds a value no cross-entropy has.
func TestDecodeFrameLosses(t *testing.T) {
	f := &Frame{Tensors: []Tensor{{Shape: []int{16}, TileH: 1, TileW: 8, K: 2,
		Indices: []uint32{1, 5, 0, 7}, Values: []float32{0.5, -1, 2, 3}}}, Losses: []float32{2.5, 0, 7}}
	good := f.mustMarshal(t)
	at := len(good) - 13 // the count, then three float32s
	if good[5] != 1 || good[at] != 3 {
		t.Fatalf("flags %d, count %d", good[5], good[at])
	}
	if g, err := DecodeFrame(good, DefaultLimits); err != nil || !reflect.DeepEqual(g.Losses, f.Losses) || g.WireSize() != len(good) {
		t.Fatalf("decoded %v, %v", g, err)
	}
	put := func(i int, v float32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[at+1+4*i:], math.Float32bits(v))
		return b
	}
	count := func(n byte) []byte { b := bytes.Clone(good); b[at] = n; return b }
	for _, tc := range []struct {
		name string
		data []byte
		lim  int
		want error
	}{
		{"negative", put(1, -0.5), MaxLosses, ErrFrame},
		{"NaN", put(0, float32(math.NaN())), MaxLosses, ErrFrame},
		{"Inf", put(2, float32(math.Inf(1))), MaxLosses, ErrFrame},
		{"zero count", count(0)[:at+1], MaxLosses, ErrFrameLimit},
		{"over the limit", good, 2, ErrFrameLimit},
		{"truncated", good[:len(good)-1], MaxLosses, ErrFrame},
		{"count beyond the data", count(4), MaxLosses, ErrFrame},
		{"trailing", append(bytes.Clone(good), 0), MaxLosses, ErrFrame},
	} {
		lim := DefaultLimits
		lim.MaxLosses = tc.lim
		if _, err := DecodeFrame(tc.data, lim); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, bad := range [][]float32{{-1}, {float32(math.NaN())}, make([]float32, MaxLosses+1)} {
		if _, err := (&Frame{Tensors: f.Tensors, Losses: bad}).MarshalBinary(); !errors.Is(err, ErrFrame) {
			t.Errorf("%d losses starting %v: encoded (%v)", len(bad), bad[0], err)
		}
	}
	if f.Fingerprint() != (&Frame{Tensors: f.Tensors}).Fingerprint() {
		t.Error("the losses change the fingerprint")
	}
}

func TestDecodeQuantizedRejectsSpareBits(t *testing.T) {
	f := &Frame{Tensors: []Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 3, Quantized: true,
		Indices: []uint32{0, 1, 2}, Values: []float32{1, -1, 1}}}}
	b := f.mustMarshal(t)
	if _, err := DecodeFrame(b, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] |= 0x80
	if _, err := DecodeFrame(b, DefaultLimits); !errors.Is(err, ErrFrame) {
		t.Fatalf("got %v", err)
	}
}

func TestMarshalRefusesInvalidFrames(t *testing.T) {
	for _, f := range []*Frame{
		{Tensors: []Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 1, Indices: []uint32{9}, Values: []float32{1}}}},
		{Tensors: []Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 1, Indices: []uint32{1}, Values: []float32{float32(math.NaN())}}}},
		{Tensors: []Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 1, Indices: []uint32{1}, Values: []float32{-2 * MaxValue}}}},
		{Tensors: []Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 1, Quantized: true, Indices: []uint32{1}, Values: []float32{0.5}}}},
		{Tensors: []Tensor{{Shape: []int{8}, TileH: 1, TileW: 8, K: 2, Indices: []uint32{1}, Values: []float32{1}}}},
	} {
		if _, err := f.MarshalBinary(); !errors.Is(err, ErrFrame) {
			t.Errorf("got %v", err)
		}
	}
}

func (f *Frame) mustMarshal(tb testing.TB) []byte {
	b, err := f.MarshalBinary()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestWireSizeAtChunk64TopK4OneBit(t *testing.T) {
	g := randomTensors(rand.New(rand.NewPCG(1, 1)), [][]int{{4096, 4096}}, 1)
	for _, tc := range []struct {
		rice bool
		min  float64 // times smaller than bf16
	}{
		{false, 900}, // docs/architecture.md §6: 8.5 bytes per 4096 parameters
		{true, 1300}, // gaps of ~1000 in ~11 bits instead of 16
	} {
		d, err := NewDeMo([][]int{{4096, 4096}}, Options{Chunk: 64, TopK: 4, Quantize1Bit: true, RiceIndices: tc.rice})
		if err != nil {
			t.Fatal(err)
		}
		f, err := d.Step(g, 1)
		if err != nil {
			t.Fatal(err)
		}
		bf16 := 2 * 4096 * 4096
		ratio := float64(bf16) / float64(f.WireSize())
		t.Logf("rice %v: wire %d bytes: %.4f bytes/param, %.0fx smaller than bf16", tc.rice, f.WireSize(), float64(f.WireSize())/(4096*4096), ratio)
		if ratio < tc.min {
			t.Errorf("rice %v: only %.0fx smaller than bf16, want %.0fx", tc.rice, ratio, tc.min)
		}
	}
}

func TestDecodeRiceIndicesRejects(t *testing.T) {
	// One 1-D tensor of 16 in tiles of 8, k=2: Rice parameter 1; gaps
	// 1, 3 | 0, 6 code as 0 1 | 1 0 1 | 0 0 | 1 1 1 0 0, 12 bits in 2 bytes.
	good := (&Frame{Tensors: []Tensor{{Shape: []int{16}, TileH: 1, TileW: 8, K: 2, RiceIndices: true,
		Indices: []uint32{1, 5, 0, 7}, Values: []float32{0.5, -1, 2, 3}}}}).mustMarshal(t)
	idxAt := firstTensor + 6
	if len(good) != idxAt+2+16 {
		t.Fatalf("frame of %d bytes, want %d", len(good), idxAt+2+16)
	}
	if f, err := DecodeFrame(good, DefaultLimits); err != nil || !reflect.DeepEqual(f.Tensors[0].Indices, []uint32{1, 5, 0, 7}) {
		t.Fatalf("decode: %v", err)
	}
	mutate := func(f func(b []byte)) []byte { b := bytes.Clone(good); f(b); return b }
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"gap beyond the tile", mutate(func(b []byte) { b[idxAt] = 0xff })},
		{"index out of tile", mutate(func(b []byte) { b[idxAt] = 0x17 })}, // gaps 7, 0: indices 7, 8
		{"spare bits", mutate(func(b []byte) { b[idxAt+1] |= 0x80 })},
		{"truncated", good[:idxAt+1]},
		{"unknown flag", mutate(func(b []byte) { b[firstTensor+1] |= 4 })},
	} {
		if _, err := DecodeFrame(tc.data, DefaultLimits); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: got %v", tc.name, err)
		}
	}
}

// gpt2SmallShapes are the parameter tensors of a 124M-parameter GPT (12
// layers, width 768, 50257 tokens, 1024 positions): the fuzz target decodes
// with the limits a trainer of such a run uses (DeMo.Limits), as trainers
// decode peers' frames.
func gpt2SmallShapes() [][]int {
	shapes := [][]int{{50257, 768}, {1024, 768}}
	for range 12 {
		shapes = append(shapes, []int{768}, []int{768}, []int{768, 2304}, []int{2304}, []int{768, 768}, []int{768},
			[]int{768}, []int{768}, []int{768, 3072}, []int{3072}, []int{3072, 768}, []int{768})
	}
	return append(shapes, []int{768}, []int{768})
}

// FuzzDecodeFrame: whatever decodes re-encodes to the same bytes, and its
// values are what aggregation may rely on: finite and within ±MaxValue (±1
// when quantized).
func FuzzDecodeFrame(f *testing.F) {
	for _, b := range sampleFrames(f) {
		f.Add(b)
	}
	// A float frame at the bound, and one just beyond it.
	for _, v := range []float32{-MaxValue, math.Nextafter32(MaxValue, math.MaxFloat32)} {
		b := (&Frame{Tensors: []Tensor{{Shape: []int{16}, TileH: 1, TileW: 8, K: 2,
			Indices: []uint32{1, 5, 0, 7}, Values: []float32{0.5, -1, 2, 3}}}}).mustMarshal(f)
		binary.LittleEndian.PutUint32(b[len(b)-4:], math.Float32bits(v))
		f.Add(b)
	}
	lim, _, err := FrameBounds(gpt2SmallShapes(), Options{Chunk: 64, TopK: 32, Quantize1Bit: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeFrame(data, lim)
		if err != nil {
			return
		}
		for _, ft := range fr.Tensors {
			for _, v := range ft.Values {
				if !(v >= -MaxValue && v <= MaxValue) || (ft.Quantized && v != 1 && v != -1) {
					t.Fatalf("decoded a value of %v (quantized %v)", v, ft.Quantized)
				}
			}
		}
		b, err := fr.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded frame does not encode: %v", err)
		}
		if !bytes.Equal(b, data) {
			t.Fatal("encode(decode(x)) != x")
		}
	})
}

// TestFingerprint: magnitudes do not change a frame's fingerprint; an index
// or a sign does.
func TestFingerprint(t *testing.T) {
	base := func() *Frame {
		return &Frame{Tensors: []Tensor{{Shape: []int{4, 4}, TileH: 4, TileW: 4, K: 3,
			Indices: []uint32{1, 5, 9}, Values: []float32{0.5, -0.25, 2}}}}
	}
	f := base()
	scaled := base()
	for i := range scaled.Tensors[0].Values {
		scaled.Tensors[0].Values[i] *= 7
	}
	if f.Fingerprint() != scaled.Fingerprint() {
		t.Fatal("a scaled copy has another fingerprint")
	}
	for name, mut := range map[string]func(*Frame){
		"an index":  func(g *Frame) { g.Tensors[0].Indices[2] = 10 },
		"a sign":    func(g *Frame) { g.Tensors[0].Values[0] = -0.5 },
		"the shape": func(g *Frame) { g.Tensors[0].Shape = []int{2, 8} },
		"a tensor":  func(g *Frame) { g.Tensors = append(g.Tensors, g.Tensors[0]) },
	} {
		g := base()
		mut(g)
		if g.Fingerprint() == f.Fingerprint() {
			t.Errorf("changing %s kept the fingerprint", name)
		}
	}
}
