package modelspec

import (
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

func TestArchNames(t *testing.T) {
	for _, tc := range []struct {
		arch        coordinator.Architecture
		name, title string
	}{
		{coordinator.ArchGPT, "gpt", "GPT"},
		{coordinator.ArchLlama, "llama", "Llama"},
		{coordinator.ArchTransformers, "transformers", "transformers"},
		{coordinator.ArchNone, "architecture 0", "architecture 0"},
		{coordinator.Architecture(200), "architecture 200", "architecture 200"},
	} {
		if got := ArchName(tc.arch); got != tc.name {
			t.Errorf("ArchName(%d) = %q, want %q", tc.arch, got, tc.name)
		}
		if got := ArchTitle(tc.arch); got != tc.title {
			t.Errorf("ArchTitle(%d) = %q, want %q", tc.arch, got, tc.title)
		}
	}
}
