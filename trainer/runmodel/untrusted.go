package runmodel

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/checkpoint"
	"github.com/psyche-go/psyche/trainer/gpt"
	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/llama"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// ErrLargerThanTensors means a checkpoint's config describes more
// parameters than its safetensors files hold values.
var ErrLargerThanTensors = errors.New("runmodel: the config describes a model larger than its tensors")

// LoadUntrusted is Load for a checkpoint no run vouches for (psyche
// generate and export, on a directory downloaded from anywhere): before
// anything is allocated for the model its config describes (config.json,
// or a checkpoint file's psyche.model metadata), the safetensors headers
// are read, and a config of more parameters than they hold values is
// refused (ErrLargerThanTensors). A config.json claiming a trillion
// parameters beside a small model.safetensors ended such a command in a
// fatal out-of-memory; the node's loader compares with its run's model
// instead (LoadChecked).
func LoadUntrusted(ctx context.Context, path string, be kernels.Backend) (Model, error) {
	held, err := heldValues(path)
	if err != nil {
		return nil, err
	}
	return LoadChecked(ctx, path, be, func(c modelspec.Config) error {
		if n := configValues(c); n > float64(held) {
			return fmt.Errorf("%w: %s describes %.4g parameters, its safetensors headers hold %d values", ErrLargerThanTensors, path, n, held)
		}
		return nil
	})
}

// configValues is c's parameter count, in float64 so that no config can
// overflow it.
func configValues(c modelspec.Config) float64 {
	var shapes [][]int
	if c.Arch == coordinator.ArchLlama {
		for _, s := range c.Llama.Specs() {
			shapes = append(shapes, s.Shape)
		}
	} else {
		for _, s := range c.GPT.Specs() {
			shapes = append(shapes, s.Shape)
		}
	}
	var n float64
	for _, sh := range shapes {
		v := 1.0
		for _, d := range sh {
			v *= float64(d)
		}
		n += math.Abs(v)
	}
	return n
}

// shardFile is the form of a shard's name an index may give (llama's rule).
var shardFile = regexp.MustCompile(`^[A-Za-z0-9_.-]+\.safetensors$`)

// heldValues is how many values the safetensors files of the checkpoint
// at path hold by their headers: the file itself, a GPT-2 directory's
// model.safetensors, a Llama directory's model.safetensors or the shards
// its index names.
func heldValues(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("runmodel: %w", err)
	}
	if !fi.IsDir() {
		return headerValues(path)
	}
	if gpt.IsHFDir(path) {
		return headerValues(filepath.Join(path, gpt.HFModelFile))
	}
	single := filepath.Join(path, llama.HFSingleFile)
	if _, err := os.Stat(single); err == nil {
		return headerValues(single)
	}
	ib, err := readSmallFile(filepath.Join(path, llama.HFIndexFile), 64<<20)
	if err != nil {
		return 0, fmt.Errorf("runmodel: %s has neither %s nor %s: %w", path, llama.HFSingleFile, llama.HFIndexFile, err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(ib, &idx); err != nil {
		return 0, fmt.Errorf("runmodel: %s: %w", filepath.Join(path, llama.HFIndexFile), err)
	}
	var files []string
	for _, f := range idx.WeightMap {
		if shardFile.MatchString(f) && !slices.Contains(files, f) {
			files = append(files, f)
		}
	}
	var total int64
	for _, f := range files {
		n, err := headerValues(filepath.Join(path, f))
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("%s: more than %d bytes", path, limit)
	}
	return b, err
}

// headerValues reads a safetensors file's header only and counts the values
// its tensors hold. Each tensor's bytes must be its shape's, within the
// file, and no two may share bytes, so the count is at most the file's
// size: a header cannot claim more than the file carries.
func headerValues(path string) (int64, error) {
	fail := func(format string, args ...any) (int64, error) {
		return 0, fmt.Errorf("runmodel: %s: %w: "+format, append([]any{path, checkpoint.ErrMalformed}, args...)...)
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("runmodel: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("runmodel: %w", err)
	}
	size := fi.Size()
	var length [8]byte
	if _, err := io.ReadFull(f, length[:]); err != nil {
		return fail("no header length (%v)", err)
	}
	n := binary.LittleEndian.Uint64(length[:])
	if n > checkpoint.DefaultMaxHeaderSize || n > uint64(max(size-8, 0)) {
		return fail("a header of %d bytes in a file of %d", n, size)
	}
	header := make([]byte, n)
	if _, err := io.ReadFull(f, header); err != nil {
		return fail("reading the header: %v", err)
	}
	data := uint64(size) - 8 - n
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(header, &entries); err != nil {
		return fail("header: %v", err)
	}
	type span struct{ begin, end uint64 }
	var spans []span
	var total uint64
	for name, raw := range entries {
		if name == "__metadata__" {
			continue
		}
		var e struct {
			DType       string   `json:"dtype"`
			Shape       []uint64 `json:"shape"`
			DataOffsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			return fail("tensor %q: %v", name, err)
		}
		width := map[string]uint64{"F32": 4, "F16": 2, "BF16": 2}[e.DType]
		if width == 0 || len(e.DataOffsets) != 2 {
			return fail("tensor %q: dtype %q, data_offsets %v", name, e.DType, e.DataOffsets)
		}
		numel := uint64(1)
		for _, d := range e.Shape {
			hi, lo := bits.Mul64(numel, d)
			if hi != 0 {
				return fail("tensor %q: shape %v", name, e.Shape)
			}
			numel = lo
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if hi, want := bits.Mul64(numel, width); hi != 0 || begin > end || end > data || end-begin != want {
			return fail("tensor %q: shape %v of %s does not fill data_offsets [%d,%d] of %d data bytes", name, e.Shape, e.DType, begin, end, data)
		}
		spans = append(spans, span{begin, end})
		total += numel
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(a.end, b.end)) })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return fail("tensors share data bytes [%d,%d)", spans[i].begin, spans[i-1].end)
		}
	}
	return int64(total), nil
}
