package p2p

import (
	"context"
	"fmt"
	"io"

	"github.com/psyche-go/psyche/coordinator"
)

// CheckpointSource is a checkpoint a node serves to joiners without holding
// its bytes: the tensors' bytes back to back, read at an offset when a peer
// asks for a block (a model is gigabytes; a trainer keeps it on the device or
// in a file, not twice in its own memory). The bytes must not change while
// the source is served; the network closes it when it serves another.
type CheckpointSource interface {
	// Specs are the tensors, in order; each takes its dtype's size times
	// its elements.
	Specs() []TensorSpec
	io.ReaderAt
	io.Closer
}

// TensorSize is the bytes t takes, or an error for a dtype checkpoints do
// not carry.
func TensorSize(t TensorSpec) (uint64, error) {
	size, ok := dtypeSize[t.DType]
	if !ok {
		return 0, fmt.Errorf("%w: dtype %q", ErrMalformed, t.DType)
	}
	for _, d := range t.Shape {
		size *= d
	}
	return size, nil
}

// Manifest reads src once, a block at a time, and lists each tensor with
// the digests of its blocks: what ShareCheckpoint offers. It also returns
// where each tensor starts in src. A CheckpointFile that knows its
// manifest (Append, Verified) is not read.
func Manifest(ctx context.Context, src CheckpointSource) (CheckpointManifest, []uint64, error) {
	if f, ok := src.(*CheckpointFile); ok && f.Complete() {
		return *f.manifest, f.starts, nil
	}
	var m CheckpointManifest
	var starts []uint64
	buf := make([]byte, BlockSize)
	off := uint64(0)
	for _, t := range src.Specs() {
		size, err := TensorSize(t)
		if err != nil {
			return m, nil, err
		}
		starts = append(starts, off)
		hs := make([]coordinator.Hash, 0, (size+BlockSize-1)/BlockSize)
		for done := uint64(0); done < size; done += BlockSize {
			if err := ctx.Err(); err != nil {
				return m, nil, err
			}
			b := buf[:min(BlockSize, size-done)]
			if _, err := src.ReadAt(b, int64(off+done)); err != nil {
				return m, nil, fmt.Errorf("p2p: reading tensor %s of the checkpoint: %w", t.Name, err)
			}
			hs = append(hs, BlockDigest(b))
		}
		m.Tensors = append(m.Tensors, TensorEntry{Name: t.Name, DType: t.DType, Shape: t.Shape,
			Blob: BlobRef{Size: size, Blocks: hs}})
		off += size
	}
	return m, starts, nil
}

// ReadTensors reads the whole of src into tensors (for a network that keeps
// checkpoints in memory, and for tests).
func ReadTensors(src CheckpointSource) ([]Tensor, error) {
	var out []Tensor
	off := int64(0)
	for _, t := range src.Specs() {
		size, err := TensorSize(t)
		if err != nil {
			return nil, err
		}
		data := make([]byte, size)
		if _, err := src.ReadAt(data, off); err != nil {
			return nil, fmt.Errorf("p2p: reading tensor %s of the checkpoint: %w", t.Name, err)
		}
		out = append(out, Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: data})
		off += int64(size)
	}
	return out, nil
}

// TensorsSource serves tensors already in memory (small checkpoints, and
// tests). Their bytes must not change.
func TensorsSource(ts []Tensor) CheckpointSource { return &tensorsSource{ts} }

type tensorsSource struct{ ts []Tensor }

func (s *tensorsSource) Specs() []TensorSpec { return SpecsOf(s.ts) }

func (s *tensorsSource) Close() error { return nil }

// ReadAt reads across tensor boundaries as if the tensors were one buffer.
func (s *tensorsSource) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for _, t := range s.ts {
		if len(p) == 0 {
			break
		}
		size := int64(len(t.Data))
		if off >= size {
			off -= size
			continue
		}
		c := copy(p, t.Data[off:])
		n += c
		p = p[c:]
		off = 0
	}
	if len(p) > 0 {
		return n, io.EOF
	}
	return n, nil
}
