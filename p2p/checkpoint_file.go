package p2p

import (
	"fmt"
	"os"

	"github.com/psyche-go/psyche/coordinator"
)

// CheckpointFile is a checkpoint's bytes, tensor after tensor, in a file
// that has no name: it is unlinked as soon as it is made, so its space
// returns to the system when it is closed and a crash leaves nothing
// behind. A trainer writes the model it offers into one (Append) and a
// joiner fetches a checkpoint into one (FetchCheckpoint), so neither holds a
// model of gigabytes in its own memory; the network then serves the blocks
// from the file. Once its blocks' digests are known (every byte appended, or
// a fetch that verified them), sharing it does not read it again.
type CheckpointFile struct {
	f      *os.File
	specs  []TensorSpec
	starts []uint64 // where each tensor starts
	size   uint64

	// What Append has written: the tensor it is in, how far, and the
	// block it is filling.
	tensor  int
	done    uint64
	block   []byte
	digests [][]coordinator.Hash

	manifest *CheckpointManifest
}

// NewCheckpointFile makes an empty checkpoint file for tensors of specs in
// the system's temporary directory.
func NewCheckpointFile(specs []TensorSpec) (*CheckpointFile, error) {
	c := &CheckpointFile{specs: specs}
	for _, t := range specs {
		size, err := TensorSize(t)
		if err != nil {
			return nil, err
		}
		c.starts = append(c.starts, c.size)
		c.size += size
		c.digests = append(c.digests, make([]coordinator.Hash, 0, (size+BlockSize-1)/BlockSize))
	}
	f, err := os.CreateTemp("", "psyche-checkpoint-*")
	if err != nil {
		return nil, fmt.Errorf("p2p: a file for a checkpoint: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("p2p: a file for a checkpoint: %w", err)
	}
	c.f = f
	return c, nil
}

// Specs are the file's tensors, in order.
func (c *CheckpointFile) Specs() []TensorSpec { return c.specs }

// Size is the bytes of every tensor together.
func (c *CheckpointFile) Size() uint64 { return c.size }

// ReadAt reads the tensors' bytes as one buffer.
func (c *CheckpointFile) ReadAt(p []byte, off int64) (int, error) { return c.f.ReadAt(p, off) }

// WriteAt writes the tensors' bytes as one buffer.
func (c *CheckpointFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || uint64(off)+uint64(len(p)) > c.size {
		return 0, fmt.Errorf("p2p: %d bytes at %d in a checkpoint of %d", len(p), off, c.size)
	}
	return c.f.WriteAt(p, off)
}

// Close closes the file, which frees its space.
func (c *CheckpointFile) Close() error { return c.f.Close() }

// Append writes the next bytes of the tensors in order, digesting each
// block as it is completed: once every byte is appended the file knows its
// manifest.
func (c *CheckpointFile) Append(p []byte) error {
	for len(p) > 0 {
		c.next()
		if c.tensor == len(c.specs) {
			return fmt.Errorf("p2p: %d bytes past the checkpoint's end", len(p))
		}
		size := c.tensorSize(c.tensor)
		if c.block == nil {
			c.block = make([]byte, 0, BlockSize)
		}
		want := min(BlockSize-uint64(len(c.block)), size-c.done-uint64(len(c.block)))
		take := min(uint64(len(p)), want)
		c.block = append(c.block, p[:take]...)
		p = p[take:]
		if take < want {
			return nil
		}
		// The block is complete: a full one, or the tensor's last.
		if _, err := c.f.WriteAt(c.block, int64(c.starts[c.tensor]+c.done)); err != nil {
			return fmt.Errorf("p2p: writing a checkpoint: %w", err)
		}
		c.digests[c.tensor] = append(c.digests[c.tensor], BlockDigest(c.block))
		c.done += uint64(len(c.block))
		c.block = c.block[:0]
		c.next()
	}
	return nil
}

// next moves Append past the tensors it has finished (those of no bytes
// included), and records the manifest after the last.
func (c *CheckpointFile) next() {
	for c.tensor < len(c.specs) && c.done == c.tensorSize(c.tensor) {
		c.tensor++
		c.done = 0
	}
	if c.tensor < len(c.specs) || c.manifest != nil {
		return
	}
	var m CheckpointManifest
	for i, t := range c.specs {
		m.Tensors = append(m.Tensors, TensorEntry{Name: t.Name, DType: t.DType, Shape: t.Shape,
			Blob: BlobRef{Size: c.tensorSize(i), Blocks: c.digests[i]}})
	}
	c.manifest, c.block, c.digests = &m, nil, nil
}

// Complete says whether the file knows its manifest: every byte appended,
// or a fetch's blocks verified.
func (c *CheckpointFile) Complete() bool {
	c.next()
	return c.manifest != nil
}

// Verified records m as the file's manifest: for a network that wrote
// every block of m into the file, each checked against its digest.
func (c *CheckpointFile) Verified(m CheckpointManifest) { c.manifest = &m }

func (c *CheckpointFile) tensorSize(i int) uint64 {
	if i+1 < len(c.starts) {
		return c.starts[i+1] - c.starts[i]
	}
	return c.size - c.starts[i]
}
