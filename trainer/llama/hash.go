package llama

import (
	"crypto/sha256"

	"github.com/psyche-go/psyche/trainer/checkpoint"
)

// Hash is the SHA-256 of the model's content as its checkpoints hold it
// (checkpoint.HashTensors of CheckpointTensors, Hugging Face names in
// order): it depends only on the parameters, so weights drawn from a seed
// and the same weights saved and loaded, in any file form, hash alike.
func (m *Model) Hash() [sha256.Size]byte { return checkpoint.HashTensors(m.CheckpointTensors()) }
