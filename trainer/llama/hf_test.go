package llama

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/trainer/checkpoint"
)

func newTiny(t testing.TB, c Config, seed uint64) *Model {
	t.Helper()
	m, err := New(c, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// rounded is what a value stored as dtype reads back as.
func rounded(v float32, dtype string) float32 {
	switch dtype {
	case "F16":
		b, _ := checkpoint.Encode([]checkpoint.Tensor{{Name: "x", Shape: []int{1}, Data: []float32{v}, DType: "F16"}}, nil)
		c, _ := checkpoint.Decode(b)
		d, _ := c.Tensor("x", []int{1})
		return d[0]
	case "BF16":
		return math.Float32frombits(uint32(checkpoint.F32ToBF16(v)) << 16)
	}
	return v
}

func TestHFRoundTrip(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		cfg   Config
		opts  HFOptions
		files []string
	}{
		{"single f32 untied", tiny, HFOptions{}, []string{HFConfigFile, HFSingleFile}},
		{"single bf16 tied", tinyTied, HFOptions{DType: "BF16"}, []string{HFConfigFile, HFSingleFile}},
		{"sharded f16", tiny, HFOptions{DType: "F16", MaxShardBytes: 1500}, nil},
		{"sharded f32 tied", tinyTied, HFOptions{MaxShardBytes: 2000}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newTiny(t, tc.cfg, 7)
			dir := t.TempDir()
			// A stale file of the other form must not survive the save.
			stale := HFSingleFile
			if tc.files != nil {
				stale = HFIndexFile
			}
			if err := os.WriteFile(filepath.Join(dir, stale), []byte("stale"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := m.SaveHF(ctx, dir, tc.opts); err != nil {
				t.Fatal(err)
			}
			ents, _ := os.ReadDir(dir)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if tc.files != nil && !slices.Equal(names, tc.files) {
				t.Fatalf("files %v, want %v", names, tc.files)
			}
			if tc.files == nil {
				if !slices.Contains(names, HFIndexFile) || slices.Contains(names, HFSingleFile) || len(names) < 4 {
					t.Fatalf("sharded save wrote %v", names)
				}
				n := len(names) - 2
				for i := 1; i <= n; i++ {
					if !slices.Contains(names, "model-0000"+string(rune('0'+i))+"-of-0000"+string(rune('0'+n))+".safetensors") {
						t.Fatalf("shard %d of %d missing from %v", i, n, names)
					}
				}
			}
			got, err := LoadHF(ctx, LocalDir(dir), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Config != tc.cfg {
				t.Fatalf("config %+v, want %+v", got.Config, tc.cfg)
			}
			for i, v := range m.Params {
				if w := rounded(v, tc.opts.DType); got.Params[i] != w {
					t.Fatalf("param %d = %g, want %g", i, got.Params[i], w)
				}
			}
			// Over HTTP with range requests, from a plain file server.
			srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
			defer srv.Close()
			viaHTTP, err := LoadHF(ctx, HTTPDir{URL: srv.URL + "/"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if viaHTTP.Hash() != got.Hash() {
				t.Fatal("the model read over HTTP differs")
			}
		})
	}
}

func TestSaveLoadCheckpointFile(t *testing.T) {
	ctx := context.Background()
	for _, c := range []Config{tiny, tinyTied} {
		m := newTiny(t, c, 9)
		path := filepath.Join(t.TempDir(), "ck.safetensors")
		if err := m.Save(ctx, path, map[string]string{"step": "3"}); err != nil {
			t.Fatal(err)
		}
		got, err := Load(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Params, m.Params) || got.Hash() != m.Hash() {
			t.Fatal("loaded parameters differ")
		}
		ck, _ := checkpoint.Load(path)
		if md := ck.Metadata(); md["format"] != "pt" || md["step"] != "3" {
			t.Fatalf("metadata %v", md)
		}
		// The HF names, as transformers expects them.
		if _, err := ck.Tensor("model.layers.1.self_attn.k_proj.weight", []int{c.KVHeads * c.HeadDim(), c.Width}); err != nil {
			t.Fatal(err)
		}
		_, hasHead := ck.Shape("lm_head.weight")
		if hasHead == c.TiedHead {
			t.Fatalf("tied %v but lm_head.weight present %v", c.TiedHead, hasHead)
		}
	}
}

// TestHFRejects edits a good checkpoint directory into each kind of
// disagreement between config.json and the tensors; each must fail before a
// model is returned, with an error that names the file and the tensor or
// field.
// TestHFConfigEps: rms_norm_eps reads back as the config's, and the
// default reads as 0, the spelling of a config built from a run.
func TestHFConfigEps(t *testing.T) {
	for _, eps := range []float32{0, DefaultNormEps, 1e-6} {
		c := tiny
		c.NormEps = eps
		b, err := HFConfigJSON(c, "F32")
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := ParseHFConfig("config.json", b)
		want := c
		if eps == DefaultNormEps {
			want.NormEps = 0
		}
		if err != nil || got != want {
			t.Fatalf("eps %g: %+v, %v", eps, got, err)
		}
	}
}

func TestHFRejects(t *testing.T) {
	ctx := context.Background()
	m := newTiny(t, tiny, 3)
	tensors := m.CheckpointTensors()
	cfgJSON, _ := HFConfigJSON(tiny, "F32")
	edit := func(ts []checkpoint.Tensor, f func([]checkpoint.Tensor) []checkpoint.Tensor) []checkpoint.Tensor {
		return f(slices.Clone(ts))
	}
	for _, tc := range []struct {
		name    string
		config  string
		tensors []checkpoint.Tensor
		want    error
		msg     []string
	}{
		{"missing tensor", string(cfgJSON), edit(tensors, func(ts []checkpoint.Tensor) []checkpoint.Tensor { return ts[1:] }),
			ErrHFMismatch, []string{"model.safetensors", "missing tensor model.embed_tokens.weight"}},
		{"extra tensor", string(cfgJSON), edit(tensors, func(ts []checkpoint.Tensor) []checkpoint.Tensor {
			return append(ts, checkpoint.Tensor{Name: "model.layers.2.mlp.up_proj.weight", Shape: []int{1}, Data: []float32{0}})
		}), ErrHFMismatch, []string{"model.safetensors", `extra tensor "model.layers.2.mlp.up_proj.weight"`}},
		{"shape", string(cfgJSON), edit(tensors, func(ts []checkpoint.Tensor) []checkpoint.Tensor {
			ts[3].Shape = []int{ts[3].Shape[1], ts[3].Shape[0]}
			return ts
		}), ErrHFMismatch, []string{"model.safetensors", `"model.layers.0.self_attn.k_proj.weight" has shape [16 8]`}},
		{"dtype", strings.Replace(string(cfgJSON), `"float32"`, `"bfloat16"`, 1), tensors,
			ErrHFMismatch, []string{"model.safetensors", "is F32 but config.json's torch_dtype is bfloat16"}},
		{"tied head differs", strings.Replace(string(cfgJSON), `"tie_word_embeddings": false`, `"tie_word_embeddings": true`, 1), tensors,
			ErrHFMismatch, []string{`"lm_head.weight"`, "not a copy"}},
		{"NaN weight", string(cfgJSON), edit(tensors, func(ts []checkpoint.Tensor) []checkpoint.Tensor {
			ts[2].Data = slices.Clone(ts[2].Data)
			ts[2].Data[5] = float32(math.NaN())
			return ts
		}), ErrHFMismatch, []string{"model.safetensors", fmt.Sprintf("tensor %q holds NaN at index 5", tensors[2].Name)}},
		{"infinite weight", string(cfgJSON), edit(tensors, func(ts []checkpoint.Tensor) []checkpoint.Tensor {
			ts[0].Data = slices.Clone(ts[0].Data)
			ts[0].Data[0] = float32(math.Inf(-1))
			return ts
		}), ErrHFMismatch, []string{"model.safetensors", `tensor "model.embed_tokens.weight" holds -Inf at index 0`}},
		{"model type", strings.Replace(string(cfgJSON), `"llama"`, `"mistral"`, 1), tensors,
			ErrHFConfig, []string{"config.json", `model_type "mistral"`}},
		{"rope scaling", strings.Replace(string(cfgJSON), `"model_type"`, `"rope_scaling": {"rope_type": "llama3"}, "model_type"`, 1), tensors,
			ErrHFConfig, []string{"config.json", "rope_scaling"}},
		{"bias", strings.Replace(string(cfgJSON), `"attention_bias": false`, `"attention_bias": true`, 1), tensors,
			ErrHFConfig, []string{"config.json", "attention_bias"}},
		{"heads", strings.Replace(string(cfgJSON), `"num_key_value_heads": 2`, `"num_key_value_heads": 3`, 1), tensors,
			ErrHFConfig, []string{"config.json", "kv heads (3)"}},
		{"not json", "{", tensors, ErrHFConfig, []string{"config.json"}},
		// A header far larger than this model's tensors need (the attack
		// was 95 MiB of empty tensors: 5 GB allocated before a name was
		// checked) is refused from its length, before it is read.
		{"header larger than the model needs", string(cfgJSON), edit(tensors, func(ts []checkpoint.Tensor) []checkpoint.Tensor {
			for i := range 4000 {
				ts = append(ts, checkpoint.Tensor{Name: fmt.Sprintf("model.layers.%d.empty", i), Shape: []int{0}})
			}
			return ts
		}), checkpoint.ErrTooLarge, []string{"model.safetensors", "header length", fmt.Sprintf("limit of %d bytes", checkpoint.HeaderLimit(tiny.Layers))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, HFConfigFile), []byte(tc.config), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := checkpoint.Save(ctx, filepath.Join(dir, HFSingleFile), tc.tensors, nil); err != nil {
				t.Fatal(err)
			}
			got, err := LoadHF(ctx, LocalDir(dir), nil)
			if !errors.Is(err, tc.want) || got != nil {
				t.Fatalf("LoadHF = %v, %v; want %v", got != nil, err, tc.want)
			}
			for _, s := range tc.msg {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

func TestHFIndexRejects(t *testing.T) {
	ctx := context.Background()
	m := newTiny(t, tiny, 3)
	dir := t.TempDir()
	if err := m.SaveHF(ctx, dir, HFOptions{MaxShardBytes: 3000}); err != nil {
		t.Fatal(err)
	}
	index, _ := os.ReadFile(filepath.Join(dir, HFIndexFile))
	for _, tc := range []struct{ name, from, to, msg string }{
		{"wrong file", `"model.norm.weight": "model-00005`, `"model.norm.weight": "model-00001`, `lists tensor "model.norm.weight" in model-00001-of-00005.safetensors, which does not hold it`},
		{"outside", `"model.norm.weight": "model-00005-of-00005.safetensors"`, `"model.norm.weight": "../x.safetensors"`, "not a safetensors file of this directory"},
		{"missing shard", `"model.norm.weight": "model-00005-of-00005.safetensors"`, `"model.norm.weight": "model-00009-of-00009.safetensors"`, `model-00005-of-00005.safetensors: tensor "model.norm.weight" is not listed for this file`},
		{"extra", `"model.norm.weight": "model-00005-of-00005.safetensors"`, `"model.norm.weight": "model-00005-of-00005.safetensors", "model.layers.7.mlp.up_proj.weight": "model-00001-of-00005.safetensors"`, `extra tensor "model.layers.7.mlp.up_proj.weight"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(index, []byte(tc.from)) {
				t.Fatalf("index lacks %s:\n%s", tc.from, index)
			}
			d := t.TempDir()
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
				if e.Name() == HFIndexFile {
					b = bytes.Replace(b, []byte(tc.from), []byte(tc.to), 1)
				}
				_ = os.WriteFile(filepath.Join(d, e.Name()), b, 0o644)
			}
			_, err := LoadHF(ctx, LocalDir(d), nil)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("LoadHF = %v, want %q", err, tc.msg)
			}
		})
	}
}

// memDir is a checkpoint directory in memory, for the fuzz target.
type memDir map[string][]byte

func (d memDir) Open(_ context.Context, name string) (io.ReadCloser, int64, error) {
	b, ok := d[name]
	if !ok {
		return nil, 0, fs.ErrNotExist
	}
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
}

func (d memDir) String() string { return "mem" }

// FuzzLoadHF feeds LoadHFChecked (the production reader, with its limits) a
// config.json and a model.safetensors from outside: it must never panic,
// must reject with one of its errors or the safetensors reader's, and a
// model it accepts must hold exactly the file's tensors.
func FuzzLoadHF(f *testing.F) {
	ctx := context.Background()
	for _, c := range []Config{tiny, tinyTied} {
		m := newTiny(f, c, 1)
		cfg, _ := HFConfigJSON(c, "BF16")
		ts := m.CheckpointTensors()
		for i := range ts {
			ts[i].DType = "BF16"
		}
		b, err := checkpoint.Encode(ts, map[string]string{"format": "pt"})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(cfg, b)
		f.Add(cfg, b[:len(b)/2])
	}
	f.Add([]byte(`{"model_type":"llama","vocab_size":1,"hidden_size":2,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":1,"max_position_embeddings":1}`), []byte{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '})
	// As a trainer does, the reader asks before it allocates: here it
	// accepts models of up to a few MB (a trainer, only the run's), so a
	// config of any size is fed and must be refused before allocation.
	errTooBig := errors.New("more parameters than the fuzzer's run allows")
	accept := func(c Config) error {
		if c.NumParams() > 1<<20 {
			return errTooBig
		}
		return nil
	}
	f.Fuzz(func(t *testing.T, cfg, st []byte) {
		m, err := LoadHFChecked(ctx, memDir{HFConfigFile: cfg, HFSingleFile: st}, nil, accept)
		if err != nil {
			if !errors.Is(err, ErrHFConfig) && !errors.Is(err, ErrHFMismatch) && !errors.Is(err, checkpoint.ErrMalformed) && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errTooBig) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		ck, err := checkpoint.Decode(st)
		if err != nil {
			t.Fatalf("LoadHF accepted what Decode rejects: %v", err)
		}
		for _, tn := range m.CheckpointTensors() {
			d, err := ck.Tensor(tn.Name, tn.Shape)
			if err != nil || !slices.EqualFunc(d, tn.Data, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
				t.Fatalf("tensor %s differs from the file (%v)", tn.Name, err)
			}
		}
	})
}

// FuzzLoadHFIndex feeds LoadHF a sharded directory whose index comes from
// outside (the shards are a real model's): any index must be refused or
// give exactly the model, never panic or read a file the index names
// outside the directory.
func FuzzLoadHFIndex(f *testing.F) {
	ctx := context.Background()
	m := newTiny(f, tiny, 1)
	dir := f.TempDir()
	if err := m.SaveHF(ctx, dir, HFOptions{MaxShardBytes: 4000}); err != nil {
		f.Fatal(err)
	}
	files := memDir{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		files[e.Name()] = b
	}
	index := files[HFIndexFile]
	f.Add(index)
	f.Add([]byte(`{"weight_map":{"model.norm.weight":"../../etc/passwd"}}`))
	f.Add([]byte(`{"weight_map":{}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, idx []byte) {
		d := memDir{}
		for k, v := range files {
			d[k] = v
		}
		d[HFIndexFile] = idx
		got, err := LoadHF(ctx, d, nil)
		if err != nil {
			if !errors.Is(err, ErrHFConfig) && !errors.Is(err, ErrHFMismatch) && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if got.Hash() != m.Hash() {
			t.Fatal("an accepted index gave other weights")
		}
	})
}

// TestLayoutIsPinned: the checkpoint layout (modelspec's Pieces: each
// layer's projections cut from the fused tensors) hashes as the
// hand-written layout it replaced did, tied head or not.
func TestLayoutIsPinned(t *testing.T) {
	for c, want := range map[*Config]string{
		&tiny:     "23a0836208c04ac4208569b27b0998d3007afa9a7572625f77616b7a95452a8e",
		&tinyTied: "adb8c7de5c58120cf9bea4b1492b7fea44992b256580167e73a2f29be5811e64",
	} {
		m, _ := New(*c, 1, nil)
		if got := m.Hash(); hex.EncodeToString(got[:]) != want {
			t.Errorf("New(%+v, 1) hashes to %x, was %s", *c, got, want)
		}
	}
}

// OpenHF reads a local directory's weights from its files as they are
// asked for, not at open: any range of a parameter, across the pieces it
// is cut into and the shards that hold them, is the model's; a value
// rewritten in the file after the open is what a later read returns.
func TestOpenHFReadsAsAsked(t *testing.T) {
	ctx := context.Background()
	for _, shard := range []int64{0, 3000} {
		m := newTiny(t, tiny, 5)
		dir := t.TempDir()
		if err := m.SaveHF(ctx, dir, HFOptions{MaxShardBytes: shard}); err != nil {
			t.Fatal(err)
		}
		w, err := OpenHF(ctx, LocalDir(dir), nil)
		if err != nil {
			t.Fatal(err)
		}
		if w.Config != m.Config {
			t.Fatalf("config %+v, want %+v", w.Config, m.Config)
		}
		for i, want := range m.Tensors() {
			for _, r := range [][2]int{{0, len(want)}, {1, len(want) - 1}, {len(want) / 2, len(want)/2 + 3}} {
				got := make([]float32, r[1]-r[0])
				if err := w.Read(ctx, i, r[0], got); err != nil || !slices.Equal(got, want[r[0]:r[1]]) {
					t.Fatalf("shards of %d: tensor %d [%d, %d): %v", shard, i, r[0], r[1], err)
				}
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// Read from the file when asked: rewrite the embeddings' first value
	// in place after the open.
	m := newTiny(t, tiny, 6)
	dir := t.TempDir()
	if err := m.SaveHF(ctx, dir, HFOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := OpenHF(ctx, LocalDir(dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	path := filepath.Join(dir, HFSingleFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first := binary.LittleEndian.AppendUint32(nil, math.Float32bits(m.Tensors()[0][0]))
	at := bytes.Index(raw[8+binary.LittleEndian.Uint64(raw):], first)
	if at < 0 {
		t.Fatal("the embeddings' first value is not in the file")
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(binary.LittleEndian.AppendUint32(nil, math.Float32bits(42)), int64(8+binary.LittleEndian.Uint64(raw))+int64(at)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got := make([]float32, 1)
	if err := w.Read(ctx, 0, 0, got); err != nil || got[0] != 42 {
		t.Fatalf("after the file changed, the first embedding reads %v, %v; want 42 (read when asked)", got[0], err)
	}
}
