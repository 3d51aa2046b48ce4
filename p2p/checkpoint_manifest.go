package p2p

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/psyche-go/psyche/coordinator"
)

// The checkpoint manifest: what a node shares so that a joiner can fetch the
// model from peers. It lists every parameter tensor with the raw blocks that
// hold its bytes. The manifest is itself stored as one raw block, so its id
// (the BlockDigest of its encoding) is all a joiner needs to start, and every
// byte it then receives is checked against a digest that chains back to that
// id.
//
// Encoding version 2 (version 1 named blocks by sha2-256), little-endian:
//
//	0    u8   version (2)
//	1    u32  tensor count T (≤ MaxCheckpointTensors)
//	then T × (
//	     u16  name length | name bytes (UTF-8, ≤ 1024)
//	     u8   dtype length | dtype bytes (e.g. "F32", "BF16"; ≤ 16)
//	     u8   rank R (≤ 8) | R × u64 dims
//	     u64  size in bytes
//	     u32  block count K (= ceil(size / BlockSize)) | K × 32 BlockDigest of each raw block
//	)
//
// The whole encoding must fit one block (1 MiB): about 30,000 blocks, a
// 30 GiB model, which is far beyond what this system trains.

const (
	manifestVersion      = 2
	MaxCheckpointTensors = 1 << 16
	maxTensorName        = 1024
	maxDTypeLen          = 16
	maxRank              = 8
)

// Tensor is one named parameter tensor: opaque bytes plus the dtype and shape
// the trainer needs to interpret them.
type Tensor struct {
	Name  string
	DType string
	Shape []uint64
	Data  []byte
}

// TensorEntry is a tensor as listed in a manifest: everything but the bytes.
type TensorEntry struct {
	Name  string
	DType string
	Shape []uint64
	Blob  BlobRef
}

// TensorSpec is what a joiner expects of one tensor of the run's model.
type TensorSpec struct {
	Name  string
	DType string // "F32": 4 bytes per element
	Shape []uint64
}

// dtypeSize is the bytes per element of the dtypes checkpoints carry.
var dtypeSize = map[string]uint64{"F32": 4}

// Match checks a manifest against the run's model before any of its blocks
// is fetched: the same tensors in the same order, with the same dtypes and
// shapes, and blobs of exactly the bytes those shapes take. A manifest that
// fits in one block could otherwise name a tensor of any size.
func (m *CheckpointManifest) Match(want []TensorSpec) error {
	if len(m.Tensors) != len(want) {
		return fmt.Errorf("%w: %d tensors, the run's model has %d", ErrMalformed, len(m.Tensors), len(want))
	}
	for i, w := range want {
		t := &m.Tensors[i]
		if t.Name != w.Name || t.DType != w.DType || !slices.Equal(t.Shape, w.Shape) {
			return fmt.Errorf("%w: tensor %d is %s %s%v, the run's model has %s %s%v", ErrMalformed, i, t.Name, t.DType, t.Shape, w.Name, w.DType, w.Shape)
		}
		size, err := TensorSize(w)
		if err != nil {
			return err
		}
		if t.Blob.Size != size {
			return fmt.Errorf("%w: tensor %s has a %d-byte blob, its shape takes %d", ErrMalformed, t.Name, t.Blob.Size, size)
		}
	}
	return nil
}

// CheckpointManifest lists a checkpoint's tensors in order.
type CheckpointManifest struct {
	Tensors []TensorEntry
}

// ID is the manifest's identifier: the BlockDigest of its encoding, which is
// also the name of the raw block it is stored in.
func (m *CheckpointManifest) ID() (coordinator.Hash, error) {
	b, err := m.MarshalBinary()
	if err != nil {
		return coordinator.Hash{}, err
	}
	return BlockDigest(b), nil
}

// MarshalBinary encodes m in version 2.
func (m *CheckpointManifest) MarshalBinary() ([]byte, error) {
	if len(m.Tensors) > MaxCheckpointTensors {
		return nil, fmt.Errorf("%w: %d tensors", ErrOversize, len(m.Tensors))
	}
	b := []byte{manifestVersion}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Tensors)))
	for i := range m.Tensors {
		t := &m.Tensors[i]
		if err := t.check(); err != nil {
			return nil, err
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(len(t.Name)))
		b = append(b, t.Name...)
		b = append(b, byte(len(t.DType)))
		b = append(b, t.DType...)
		b = append(b, byte(len(t.Shape)))
		for _, d := range t.Shape {
			b = binary.LittleEndian.AppendUint64(b, d)
		}
		b = binary.LittleEndian.AppendUint64(b, t.Blob.Size)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(t.Blob.Blocks)))
		for _, h := range t.Blob.Blocks {
			b = append(b, h[:]...)
		}
		if len(b) > BlockSize {
			return nil, fmt.Errorf("%w: manifest exceeds one block", ErrOversize)
		}
	}
	return b, nil
}

func (t *TensorEntry) check() error {
	switch {
	case len(t.Name) > maxTensorName:
		return fmt.Errorf("%w: tensor name of %d bytes", ErrMalformed, len(t.Name))
	case len(t.DType) > maxDTypeLen:
		return fmt.Errorf("%w: dtype of %d bytes", ErrMalformed, len(t.DType))
	case len(t.Shape) > maxRank:
		return fmt.Errorf("%w: rank %d", ErrMalformed, len(t.Shape))
	case uint64(len(t.Blob.Blocks)) != blocksFor(t.Blob.Size):
		return fmt.Errorf("%w: tensor %q has %d blocks for %d bytes", ErrMalformed, t.Name, len(t.Blob.Blocks), t.Blob.Size)
	}
	return nil
}

// DecodeCheckpointManifest parses a manifest fetched from a peer. The caller
// checks that its BlockDigest is the id it asked for.
func DecodeCheckpointManifest(b []byte) (CheckpointManifest, error) {
	var m CheckpointManifest
	if len(b) > BlockSize {
		return m, fmt.Errorf("%w: manifest of %d bytes", ErrOversize, len(b))
	}
	r := reader{b: b}
	if v := r.u8(); r.err == nil && v != manifestVersion {
		return m, fmt.Errorf("%w: manifest version %d", ErrVersion, v)
	}
	n := r.u32()
	if n > MaxCheckpointTensors {
		return m, fmt.Errorf("%w: %d tensors", ErrOversize, n)
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		var t TensorEntry
		t.Name = string(r.bytes(int(r.u16())))
		t.DType = string(r.bytes(int(r.u8())))
		rank := int(r.u8())
		if rank > maxRank {
			return m, fmt.Errorf("%w: rank %d", ErrMalformed, rank)
		}
		for j := 0; j < rank; j++ {
			t.Shape = append(t.Shape, r.u64())
		}
		t.Blob.Size = r.u64()
		k := r.u32()
		if uint64(k) > uint64(len(b))/32 { // cheaper than allocating what cannot be there
			return m, fmt.Errorf("%w: %d blocks", ErrShortBuffer, k)
		}
		for j := uint32(0); j < k && r.err == nil; j++ {
			var h coordinator.Hash
			copy(h[:], r.bytes(32))
			t.Blob.Blocks = append(t.Blob.Blocks, h)
		}
		if r.err == nil {
			if err := t.check(); err != nil {
				return CheckpointManifest{}, err
			}
		}
		m.Tensors = append(m.Tensors, t)
	}
	if err := r.done(); err != nil {
		return CheckpointManifest{}, err
	}
	return m, nil
}

// SpecsOf is what a checkpoint holding exactly ts must match.
func SpecsOf(ts []Tensor) []TensorSpec {
	out := make([]TensorSpec, len(ts))
	for i, t := range ts {
		out[i] = TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	return out
}
