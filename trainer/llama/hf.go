package llama

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/psyche-go/psyche/internal/atomicfile"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/internal/lm"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// The files of a Hugging Face checkpoint directory.
const (
	HFConfigFile = "config.json"
	HFSingleFile = "model.safetensors"
	HFIndexFile  = "model.safetensors.index.json"
)

// maxJSONFile bounds config.json and the index, which hold a few hundred
// bytes per tensor: 64 MiB is far beyond any real model's.
const maxJSONFile = 64 << 20

// hfConfig is the part of transformers' LlamaConfig (config.json) this
// trainer writes; it reads the same fields and refuses the ones that would
// change the computation in a way it does not implement.
type hfConfig struct {
	Architectures         []string `json:"architectures"`
	ModelType             string   `json:"model_type"`
	VocabSize             int      `json:"vocab_size"`
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      int      `json:"num_key_value_heads"`
	MaxPositionEmbeddings int      `json:"max_position_embeddings"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	RopeTheta             float64  `json:"rope_theta"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	HiddenAct             string   `json:"hidden_act"`
	AttentionBias         bool     `json:"attention_bias"`
	MLPBias               bool     `json:"mlp_bias"`
	TorchDType            string   `json:"torch_dtype"`
	// DType is the name transformers 5 writes torch_dtype under.
	DType            string  `json:"dtype,omitempty"`
	InitializerRange float64 `json:"initializer_range"`
	// RopeParameters is where transformers 5 writes rope_theta (and the
	// rope type, "default" for plain RoPE): its LlamaConfig saves no
	// top-level rope_theta, so reading only that would silently load a
	// Llama 3 checkpoint with θ = 10000.
	RopeParameters *hfRopeParameters `json:"rope_parameters,omitempty"`
	// Read only, to refuse what is not implemented.
	RopeScaling json.RawMessage `json:"rope_scaling,omitempty"`
	HeadDim     int             `json:"head_dim,omitempty"`
}

// hfRopeParameters is config.json's rope_parameters (transformers 5).
type hfRopeParameters struct {
	RopeTheta *float64 `json:"rope_theta"`
	RopeType  string   `json:"rope_type"`
}

// torch dtype names and safetensors dtypes.
var (
	torchToST = map[string]string{"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
	stToTorch = map[string]string{"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
)

// HFConfigJSON is config.json for this model's shape with tensors stored
// as dtype ("F32", "F16" or "BF16").
func HFConfigJSON(c Config, dtype string) ([]byte, error) {
	td, ok := stToTorch[dtype]
	if !ok {
		return nil, fmt.Errorf("llama: dtype %q is not F32, F16 or BF16", dtype)
	}
	h := hfConfig{Architectures: []string{"LlamaForCausalLM"}, ModelType: "llama", VocabSize: c.Vocab,
		HiddenSize: c.Width, IntermediateSize: c.Intermediate, NumHiddenLayers: c.Layers,
		NumAttentionHeads: c.Heads, NumKeyValueHeads: c.KVHeads, MaxPositionEmbeddings: c.Context,
		RMSNormEps: shortest(c.Eps()), RopeTheta: shortest(c.RopeTheta), TieWordEmbeddings: c.TiedHead,
		HiddenAct: "silu", TorchDType: td, InitializerRange: 0.02}
	b, err := json.MarshalIndent(h, "", "  ")
	return append(b, '\n'), err
}

// shortest is the float64 of v's shortest decimal form, so config.json says
// 1e-05, not the float32's exact binary value 9.999999747378752e-06; it
// reads back as the same float32.
func shortest(v float32) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(float64(v), 'g', -1, 32), 64)
	return f
}

// ParseHFConfig reads a config.json (named file in errors) into a Config and
// the safetensors dtype its torch_dtype names ("" if it names none).
func ParseHFConfig(file string, b []byte) (Config, string, error) {
	fail := func(format string, args ...any) (Config, string, error) {
		return Config{}, "", fmt.Errorf("%w: %s: "+format, append([]any{ErrHFConfig, file}, args...)...)
	}
	// Defaults are transformers' LlamaConfig defaults for the fields a
	// config may leave out.
	h := hfConfig{HiddenAct: "silu", RMSNormEps: 1e-6, RopeTheta: 10000, TieWordEmbeddings: false}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&h); err != nil {
		return fail("%v", err)
	}
	if rp := h.RopeParameters; rp != nil {
		if rp.RopeType != "" && rp.RopeType != "default" {
			return fail("rope_parameters.rope_type %q is not supported (plain RoPE only)", rp.RopeType)
		}
		if rp.RopeTheta != nil {
			h.RopeTheta = *rp.RopeTheta
		}
	}
	if h.TorchDType == "" {
		h.TorchDType = h.DType
	}
	switch {
	case h.ModelType != "llama":
		return fail("model_type %q is not llama", h.ModelType)
	case h.HiddenAct != "silu":
		return fail("hidden_act %q is not silu (SwiGLU)", h.HiddenAct)
	case h.AttentionBias || h.MLPBias:
		return fail("attention_bias and mlp_bias must be false: this trainer's Llama has no biases")
	case len(h.RopeScaling) > 0 && string(h.RopeScaling) != "null":
		return fail("rope_scaling %s is not supported (plain RoPE only)", h.RopeScaling)
	case h.NumAttentionHeads > 0 && h.HeadDim != 0 && h.HeadDim != h.HiddenSize/h.NumAttentionHeads:
		return fail("head_dim %d is not hidden_size/num_attention_heads = %d", h.HeadDim, h.HiddenSize/h.NumAttentionHeads)
	case h.RMSNormEps <= 0 || h.RMSNormEps >= 1:
		return fail("rms_norm_eps %g is not in (0, 1)", h.RMSNormEps)
	case h.RopeTheta > math.MaxFloat32:
		return fail("rope_theta %g does not fit a float32", h.RopeTheta)
	}
	dtype := ""
	if h.TorchDType != "" {
		var ok bool
		if dtype, ok = torchToST[h.TorchDType]; !ok {
			return fail("torch_dtype %q is not float32, float16 or bfloat16", h.TorchDType)
		}
	}
	kv := h.NumKeyValueHeads
	if kv == 0 {
		kv = h.NumAttentionHeads // transformers' default: multi-head attention
	}
	c := Config{Vocab: h.VocabSize, Context: h.MaxPositionEmbeddings, Width: h.HiddenSize, Layers: h.NumHiddenLayers,
		Heads: h.NumAttentionHeads, KVHeads: kv, Intermediate: h.IntermediateSize, RopeTheta: float32(h.RopeTheta),
		TiedHead: h.TieWordEmbeddings, NormEps: float32(h.RMSNormEps)}
	if c.NormEps == DefaultNormEps {
		// The default is spelled 0, as in a config built from a run's
		// model, so the two compare equal (a node keeps a model whose
		// config is the run's).
		c.NormEps = 0
	}
	if err := c.Validate(); err != nil {
		return fail("%v", err)
	}
	return c, dtype, nil
}

// CheckpointTensors names the parameter tensors with Hugging Face's names,
// one per layer and projection (Pieces: views, not copies).
func (m *Model) CheckpointTensors() []checkpoint.Tensor { return lm.Cut(m.Pieces(), m.Tensors()) }

// HFGradTensors names the gradients as CheckpointTensors names the
// parameters, Hugging Face's names (views into Grads): what
// scripts/check-torch compares.
func (m *Model) HFGradTensors() []checkpoint.Tensor { return lm.Cut(m.Pieces(), m.GradTensors()) }

// ignoredTensors are buffers that older transformers versions saved with
// the weights and that hold no parameter (RoPE's inverse frequencies, which
// this model computes from rope_theta).
var ignoredTensors = regexp.MustCompile(`^model\.layers\.[0-9]+\.self_attn\.rotary_emb\.inv_freq$`)

// tensorReader reads a range of a named tensor: an opened local file
// (checkpoint.File) or one read whole (checkpoint.Checkpoint).
type tensorReader interface {
	Read(name string, off int, dst []float32) error
}

// heldTensor is where a tensor of the directory lies.
type heldTensor struct {
	file string
	r    tensorReader
}

// HFWeights are the weights of a Hugging Face Llama directory, checked
// against its config.json from the files' headers (every tensor there, of
// its shape and dtype, nothing extra) and read a range at a time from its
// files as they are asked for: a local directory's files stay on disk, so
// a model of gigabytes is handed on (to an engine that holds it elsewhere,
// to a hash) without being held here. A value that is not finite fails
// the read that meets it: a damaged file, not a starting point.
type HFWeights struct {
	Config  Config
	pieces  []modelspec.Piece
	byParam [][]int // the pieces of each parameter tensor
	from    map[string]heldTensor
	closers []io.Closer
}

// Read copies values [off, off+len(dst)) of parameter tensor i (the
// model's order, Shapes) into dst.
func (w *HFWeights) Read(ctx context.Context, i, off int, dst []float32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, k := range w.byParam[i] {
		p := w.pieces[k]
		lo, hi := max(off, p.Offset), min(off+len(dst), p.Offset+modelspec.Size(p.Shape))
		if lo >= hi {
			continue
		}
		out := dst[lo-off : hi-off]
		src := w.from[p.Name]
		if err := src.r.Read(p.Name, lo-p.Offset, out); err != nil {
			return fmt.Errorf("llama: %s: %w", src.file, err)
		}
		if j := slices.IndexFunc(out, notFinite); j >= 0 {
			return fmt.Errorf("%w: %s: tensor %q holds %v at index %d", ErrHFMismatch, src.file, p.Name, out[j], lo-p.Offset+j)
		}
	}
	return nil
}

// Close closes the directory's files.
func (w *HFWeights) Close() error {
	var errs []error
	for _, c := range w.closers {
		errs = append(errs, c.Close())
	}
	w.closers = nil
	return errors.Join(errs...)
}

func notFinite(v float32) bool { return math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) }

// hfCheck checks a directory's files against a config, a file at a time,
// from their headers, and notes where each tensor lies.
type hfCheck struct {
	cfg   Config
	dtype string // "" accepts any
	want  map[string]modelspec.Piece
	from  map[string]heldTensor
	// a tied model's lm_head.weight, when a file holds one anyway: it must
	// equal the embeddings, which may come later (names sort before them)
	tiedHead *heldTensor
}

// newHFCheck is a check of files against cfg, and the weights it fills in
// once the check is finished.
func newHFCheck(cfg Config, dtype string) (*HFWeights, *hfCheck) {
	w := &HFWeights{Config: cfg, pieces: cfg.Pieces(), byParam: make([][]int, len(cfg.Shapes()))}
	l := &hfCheck{cfg: cfg, dtype: dtype, want: map[string]modelspec.Piece{}, from: map[string]heldTensor{}}
	for k, p := range w.pieces {
		w.byParam[p.Tensor] = append(w.byParam[p.Tensor], k)
		l.want[p.Name] = p
	}
	return w, l
}

// take checks the tensors of one file. expect, if not nil, is the set of
// names the index says this file holds.
func (l *hfCheck) take(file string, infos []checkpoint.TensorInfo, r tensorReader, expect map[string]bool) error {
	for _, t := range infos {
		name := t.Name
		if ignoredTensors.MatchString(name) {
			continue
		}
		if name == "lm_head.weight" && l.cfg.TiedHead {
			// Some tied checkpoints store the head anyway; finish checks
			// that it is the embedding it is tied to.
			if want := []int{l.cfg.Vocab, l.cfg.Width}; !slices.Equal(t.Shape, want) {
				return fmt.Errorf("%w: %s: tensor %q has shape %v, config.json's model needs %v", ErrHFMismatch, file, name, t.Shape, want)
			}
			l.tiedHead = &heldTensor{file, r}
			continue
		}
		p, ok := l.want[name]
		if !ok {
			return fmt.Errorf("%w: %s: extra tensor %q (shape %v) that config.json's model does not have", ErrHFMismatch, file, name, t.Shape)
		}
		if expect != nil && !expect[name] {
			return fmt.Errorf("%w: %s: tensor %q is not listed for this file in %s", ErrHFMismatch, file, name, HFIndexFile)
		}
		if prev, ok := l.from[name]; ok {
			return fmt.Errorf("%w: %s: tensor %q is also in %s", ErrHFMismatch, file, name, prev.file)
		}
		if l.dtype != "" && t.DType != l.dtype {
			return fmt.Errorf("%w: %s: tensor %q is %s but config.json's torch_dtype is %s", ErrHFMismatch, file, name, t.DType, stToTorch[l.dtype])
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return fmt.Errorf("%w: %s: tensor %q has shape %v, config.json's model needs %v", ErrHFMismatch, file, name, t.Shape, p.Shape)
		}
		l.from[name] = heldTensor{file, r}
	}
	return nil
}

// finish reports a tensor no file held, and a stored tied head that is not
// the embedding, compared a chunk at a time.
func (l *hfCheck) finish(where string) error {
	var missing []string
	for name := range l.want {
		if _, ok := l.from[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		more := ""
		if len(missing) > 5 {
			more = fmt.Sprintf(" and %d more", len(missing)-5)
			missing = missing[:5]
		}
		return fmt.Errorf("%w: %s: missing tensor %s%s", ErrHFMismatch, where, strings.Join(missing, ", "), more)
	}
	if l.tiedHead == nil {
		return nil
	}
	const embed = "model.embed_tokens.weight"
	size := l.cfg.Vocab * l.cfg.Width
	head, emb := make([]float32, min(size, 1<<16)), make([]float32, min(size, 1<<16))
	for off := 0; off < size; off += len(head) {
		n := min(len(head), size-off)
		if err := l.tiedHead.r.Read("lm_head.weight", off, head[:n]); err != nil {
			return fmt.Errorf("llama: %s: %w", l.tiedHead.file, err)
		}
		if err := l.from[embed].r.Read(embed, off, emb[:n]); err != nil {
			return fmt.Errorf("llama: %s: %w", l.from[embed].file, err)
		}
		if !slices.Equal(head[:n], emb[:n]) {
			return fmt.Errorf("%w: %s: tensor \"lm_head.weight\": tie_word_embeddings is true but it is not a copy of %s", ErrHFMismatch, l.tiedHead.file, embed)
		}
	}
	return nil
}

// Dir is a checkpoint directory to read: local (LocalDir) or remote (the
// trainer's HTTP source with range requests).
type Dir interface {
	// Open returns a reader of the named file and its size in bytes; the
	// error wraps fs.ErrNotExist when there is no such file.
	Open(ctx context.Context, name string) (io.ReadCloser, int64, error)
	// String names the directory in errors.
	String() string
}

// LocalDir is a directory on this machine.
type LocalDir string

// Open implements Dir.
func (d LocalDir) Open(_ context.Context, name string) (io.ReadCloser, int64, error) {
	f, err := os.Open(filepath.Join(string(d), name))
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%s: not a regular file", f.Name())
	}
	return f, fi.Size(), nil
}

func (d LocalDir) String() string { return string(d) }

func readSmall(ctx context.Context, d Dir, name string) ([]byte, error) {
	r, size, err := d.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if size > maxJSONFile {
		return nil, fmt.Errorf("%w: %s/%s is %d bytes, more than %d", ErrHFConfig, d, name, size, maxJSONFile)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("llama: reading %s/%s: %w", d, name, err)
	}
	return b, nil
}

// hfIndex is model.safetensors.index.json.
type hfIndex struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// shardName is the only form of file name an index may point at, so a
// hostile index cannot name a path outside the directory.
var shardName = regexp.MustCompile(`^[A-Za-z0-9_.-]+\.safetensors$`)

// LoadHF builds the model a Hugging Face checkpoint directory holds
// (OpenHF, every value read into a model of config.json's shape).
func LoadHF(ctx context.Context, d Dir, be kernels.Backend) (*Model, error) {
	return LoadHFChecked(ctx, d, be, nil)
}

// LoadHFChecked is LoadHF that calls accept (unless nil) with config.json's
// model before anything is allocated for it, and stops with its error: a
// directory from elsewhere may describe a model of any size.
func LoadHFChecked(ctx context.Context, d Dir, be kernels.Backend, accept func(Config) error) (*Model, error) {
	w, err := OpenHF(ctx, d, accept)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	m, err := New(w.Config, 0, be)
	if err != nil {
		return nil, err
	}
	for i, t := range m.Tensors() {
		if err := w.Read(ctx, i, 0, t); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// OpenHF opens a Hugging Face checkpoint directory for reading its weights
// a range at a time (HFWeights): config.json, then model.safetensors or, if
// there is none, the shards that model.safetensors.index.json lists. Every
// tensor is checked against the config (name, shape, dtype) from the
// files' headers, and a missing, extra or mismatched tensor is an error
// naming the file and the tensor, returned before any weight is read. A
// local directory's files are opened, not read; a remote one's are
// downloaded into files that have no name (checkpoint.Limits.Spool).
// accept (unless nil) is called with config.json's model before anything
// is allocated for it, and stops with its error. The caller closes the
// weights.
func OpenHF(ctx context.Context, d Dir, accept func(Config) error) (*HFWeights, error) {
	cb, err := readSmall(ctx, d, HFConfigFile)
	if err != nil {
		return nil, fmt.Errorf("llama: %s: %w", d, err)
	}
	cfg, dtype, err := ParseHFConfig(d.String()+"/"+HFConfigFile, cb)
	if err != nil {
		return nil, err
	}
	if accept != nil {
		if err := accept(cfg); err != nil {
			return nil, fmt.Errorf("llama: %s/%s: %w", d, HFConfigFile, err)
		}
	}
	w, l := newHFCheck(cfg, dtype)
	ok := false
	defer func() {
		if !ok {
			w.Close()
		}
	}()
	// The tensors cannot hold more bytes than the model has F32 values,
	// and their header no more than the model's tensors need.
	lim := checkpoint.Limits{MaxDataSize: 4*int64(cfg.NumParams()) + 4*int64(cfg.Vocab*cfg.Width),
		MaxHeaderSize: checkpoint.HeaderLimit(cfg.Layers)}
	readFile := func(name string, expect map[string]bool) error {
		file := d.String() + "/" + name
		if local, isLocal := d.(LocalDir); isLocal {
			f, err := lim.Open(filepath.Join(string(local), name))
			if err != nil {
				return fmt.Errorf("llama: %s: %w", d, err)
			}
			w.closers = append(w.closers, f)
			return l.take(file, f.Tensors(), f, expect)
		}
		// A remote file is downloaded to disk, not into memory.
		r, size, err := d.Open(ctx, name)
		if err != nil {
			return fmt.Errorf("llama: %s: %w", d, err)
		}
		defer r.Close()
		f, err := lim.Spool(r, size, file)
		if err != nil {
			return fmt.Errorf("llama: %s/%s: %w", d, name, err)
		}
		w.closers = append(w.closers, f)
		return l.take(file, f.Tensors(), f, expect)
	}
	where := d.String() + "/" + HFSingleFile
	err = readFile(HFSingleFile, nil)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		where = d.String() + "/" + HFIndexFile
		err = readShards(ctx, d, l, readFile)
	case err != nil:
		return nil, err
	}
	if err == nil {
		err = l.finish(where)
	}
	if err != nil {
		return nil, err
	}
	w.from, ok = l.from, true
	return w, nil
}

// readShards reads the shards the directory's index lists, each checked
// to hold exactly the tensors the index places in it.
func readShards(ctx context.Context, d Dir, l *hfCheck, readFile func(name string, expect map[string]bool) error) error {
	ib, err := readSmall(ctx, d, HFIndexFile)
	if err != nil {
		return fmt.Errorf("llama: %s has neither %s nor %s: %w", d, HFSingleFile, HFIndexFile, err)
	}
	var idx hfIndex
	if err := json.Unmarshal(ib, &idx); err != nil || len(idx.WeightMap) == 0 {
		return fmt.Errorf("%w: %s/%s: no weight_map (%v)", ErrHFConfig, d, HFIndexFile, err)
	}
	files := map[string]map[string]bool{}
	for name, file := range idx.WeightMap {
		if !shardName.MatchString(file) {
			return fmt.Errorf("%w: %s/%s: tensor %q is in %q, not a safetensors file of this directory", ErrHFConfig, d, HFIndexFile, name, file)
		}
		if _, ok := l.want[name]; !ok && !ignoredTensors.MatchString(name) && (name != "lm_head.weight" || !l.cfg.TiedHead) {
			return fmt.Errorf("%w: %s/%s: extra tensor %q that config.json's model does not have", ErrHFMismatch, d, HFIndexFile, name)
		}
		if files[file] == nil {
			files[file] = map[string]bool{}
		}
		files[file][name] = true
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	slices.Sort(names)
	for _, f := range names {
		if err := readFile(f, files[f]); err != nil {
			return err
		}
		for name := range files[f] {
			if _, ok := l.want[name]; ok && l.from[name].file != d.String()+"/"+f {
				return fmt.Errorf("%w: %s/%s: lists tensor %q in %s, which does not hold it", ErrHFMismatch, d, HFIndexFile, name, f)
			}
		}
	}
	return nil
}

// HFOptions says how SaveHF writes.
type HFOptions struct {
	// DType of the stored tensors: "F32" (the default), "F16" or "BF16".
	DType string
	// MaxShardBytes starts a new shard before a tensor that would take a
	// shard past it (0: one file, model.safetensors). A tensor larger than
	// the limit gets a shard of its own.
	MaxShardBytes int64
}

// SaveHF writes the model as a Hugging Face checkpoint directory: config.json
// and model.safetensors, or model-0000N-of-0000M.safetensors shards and
// model.safetensors.index.json. Each file is written atomically; a shard
// set is complete once the index is there (it is written last).
func (m *Model) SaveHF(ctx context.Context, dir string, o HFOptions) error {
	return SaveHFTensors(ctx, dir, m.Config, m.CheckpointTensors(), o)
}

// SaveHFTensors is SaveHF of a model of config c whose checkpoint tensors
// (Pieces) are tensors: their values may come from Fill, so a model held
// elsewhere is written a chunk at a time.
func SaveHFTensors(ctx context.Context, dir string, c Config, tensors []checkpoint.Tensor, o HFOptions) error {
	dtype := o.DType
	if dtype == "" {
		dtype = "F32"
	}
	cfgJSON, err := HFConfigJSON(c, dtype)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("llama: %w", err)
	}
	size := int64(2)
	if dtype == "F32" {
		size = 4
	}
	var shards [][]checkpoint.Tensor
	var cur []checkpoint.Tensor
	var curBytes, total int64
	for _, t := range tensors {
		t.DType = dtype
		b := size * int64(modelspec.Size(t.Shape))
		total += b
		if o.MaxShardBytes > 0 && len(cur) > 0 && curBytes+b > o.MaxShardBytes {
			shards, cur, curBytes = append(shards, cur), nil, 0
		}
		cur = append(cur, t)
		curBytes += b
	}
	shards = append(shards, cur)
	meta := map[string]string{"format": "pt"}
	if err := atomicfile.WriteFile(filepath.Join(dir, HFConfigFile), cfgJSON, 0o644); err != nil {
		return fmt.Errorf("llama: %w", err)
	}
	// A directory holds one form: the other's files, from an earlier save,
	// would be read instead of (or mixed with) these.
	if len(shards) == 1 {
		if err := checkpoint.Save(ctx, filepath.Join(dir, HFSingleFile), shards[0], meta); err != nil {
			return err
		}
		return removeIfThere(filepath.Join(dir, HFIndexFile))
	}
	if err := removeIfThere(filepath.Join(dir, HFSingleFile)); err != nil {
		return err
	}
	idx := hfIndex{Metadata: map[string]any{"total_size": total}, WeightMap: map[string]string{}}
	for i, sh := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		if err := checkpoint.Save(ctx, filepath.Join(dir, name), sh, meta); err != nil {
			return err
		}
		for _, t := range sh {
			idx.WeightMap[t.Name] = name
		}
	}
	ib, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return fmt.Errorf("llama: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, HFIndexFile), append(ib, '\n'), 0o644); err != nil {
		return fmt.Errorf("llama: %w", err)
	}
	return nil
}

func removeIfThere(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("llama: %w", err)
	}
	return nil
}
