package gpt

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/psyche-go/psyche/trainer/checkpoint"
)

func TestCheckpointRoundTrip(t *testing.T) {
	m, _ := New(tiny, 5, nil)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := m.Save(context.Background(), path, map[string]string{"step": "12"}); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Config != m.Config || !slices.Equal(got.Params, m.Params) {
		t.Fatal("loaded model differs")
	}
	// A checkpoint of another shape is refused.
	other, _ := New(Config{Vocab: 11, Context: 6, Width: 8, Layers: 1, Heads: 2}, 5, nil)
	ck, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.LoadParams(ck); err == nil {
		t.Fatal("loaded a checkpoint of another shape")
	}
	// A checkpoint without model metadata is refused.
	bare := filepath.Join(t.TempDir(), "bare.safetensors")
	if err := checkpoint.Save(context.Background(), bare, m.CheckpointTensors(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bare, nil); !errors.Is(err, checkpoint.ErrNoModelConfig) {
		t.Fatalf("got %v", err)
	}
}
