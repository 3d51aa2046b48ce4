package modelspec

import (
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
)

// ArchName is how run files (model.architecture) and the PyTorch worker's
// open request spell a: "gpt", "llama" or "transformers".
func ArchName(a coordinator.Architecture) string {
	switch a {
	case coordinator.ArchGPT:
		return "gpt"
	case coordinator.ArchLlama:
		return "llama"
	case coordinator.ArchTransformers:
		return "transformers"
	}
	return fmt.Sprintf("architecture %d", a)
}

// ArchTitle is how psyche names a to people in what it prints: "GPT",
// "Llama" or "transformers" (a Hugging Face model of any family).
func ArchTitle(a coordinator.Architecture) string {
	switch a {
	case coordinator.ArchGPT:
		return "GPT"
	case coordinator.ArchLlama:
		return "Llama"
	}
	return ArchName(a)
}
