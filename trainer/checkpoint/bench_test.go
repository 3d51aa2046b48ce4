package checkpoint

import (
	"bytes"
	"path/filepath"
	"testing"
)

// benchTensors is a ~10M-parameter GPT-like set at width 512: token and
// position embeddings, three blocks of attention and MLP weights (3.1M
// parameters each) and their norms, 10,096,128 parameters (40 MB) in all.
func benchTensors() ([]Tensor, int64) {
	const d = 512
	var ts []Tensor
	add := func(name string, shape ...int) {
		n := 1
		for _, s := range shape {
			n *= s
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(i%1000) * 1e-3
		}
		ts = append(ts, Tensor{Name: name, Shape: shape, Data: data})
	}
	add("wte", 256, d)
	add("wpe", 1024, d)
	for l := range 3 {
		p := "h." + string(rune('0'+l)) + "."
		add(p+"attn.qkv", d, 3*d)
		add(p+"attn.proj", d, d)
		add(p+"mlp.fc", d, 4*d)
		add(p+"mlp.proj", 4*d, d)
		add(p+"ln1", d)
		add(p+"ln2", d)
	}
	add("ln_f", d)
	var params int64
	for _, t := range ts {
		params += int64(len(t.Data))
	}
	return ts, params
}

func BenchmarkSave(b *testing.B) {
	ts, params := benchTensors()
	path := filepath.Join(b.TempDir(), "m.safetensors")
	b.SetBytes(4 * params)
	for b.Loop() {
		if err := Save(b.Context(), path, ts, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLoad(b *testing.B) {
	ts, params := benchTensors()
	path := filepath.Join(b.TempDir(), "m.safetensors")
	if err := Save(b.Context(), path, ts, nil); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(4 * params)
	for b.Loop() {
		if _, err := Load(path); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	ts, params := benchTensors()
	b.SetBytes(4 * params)
	for b.Loop() {
		if _, err := Encode(ts, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	ts, params := benchTensors()
	enc, err := Encode(ts, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(4 * params)
	for b.Loop() {
		if _, err := Read(bytes.NewReader(enc), int64(len(enc))); err != nil {
			b.Fatal(err)
		}
	}
}

func TestBenchTensorsSize(t *testing.T) {
	if _, params := benchTensors(); params != 10_096_128 {
		t.Fatalf("benchTensors has %d parameters", params)
	}
}
