package gpt

import (
	"crypto/sha256"

	"github.com/psyche-go/psyche/trainer/checkpoint"
)

// Hash is the SHA-256 of the model's content as its checkpoints hold it:
// for each tensor of CheckpointTensors, in order, its name, its shape and
// its float32 little-endian data, each prefixed by its length (a uint64,
// little-endian: the name's and the data's in bytes, the shape's in
// dimensions), so no two different tensor lists hash the same bytes. It
// depends only on the parameters, not on the file they came from (a
// checkpoint's metadata is not hashed): a model drawn from a seed and the
// same model saved and loaded hash alike, which is what lets a run name its
// starting model by hash whatever the source. The model's shape is in the
// tensor shapes except its head count, which the run's config check covers.
func (m *Model) Hash() [sha256.Size]byte { return checkpoint.HashTensors(m.CheckpointTensors()) }
