// Package torchref holds what the two torchref programs
// (trainer/gpt/internal/torchref, trainer/llama/internal/torchref) share:
// they write a small model with random weights as a Hugging Face directory,
// a batch, and what the Go model computes from them, for scripts/check-torch
// to compare with PyTorch.
//
// A program's output directory holds model/ (the Hugging Face directory),
// go.safetensors (logits, loss, grad.<Hugging Face name> for every
// parameter, and whatever else the program adds) and run.json (the batch
// and the program's settings).
package torchref

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/psyche-go/psyche/trainer/checkpoint"
)

// Model is what a pass needs of a model.
type Model interface {
	Forward(inputs, targets []uint32, b, t int) (float32, error)
	Logits() []float32
	ZeroGrad()
	Backward() error
	// HFGradTensors are the gradients with the Hugging Face names and
	// layout the model's export writes its parameters in.
	HFGradTensors() []checkpoint.Tensor
}

// Batch is the batch a program computes on: B sequences of T tokens. A
// program's run record embeds it, so run.json has its fields at the top.
type Batch struct {
	B, T            int
	Inputs, Targets []uint32
}

// Main parses the command line (-dir, the output directory, and the flags
// the program defined before calling it) and runs write with the
// directory, exiting 2 without -dir and 1 when write fails.
func Main(write func(ctx context.Context, dir string) error) {
	dir := flag.String("dir", "", "output directory")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "torchref: -dir is required")
		os.Exit(2)
	}
	if err := write(context.Background(), *dir); err != nil {
		fmt.Fprintln(os.Stderr, "torchref:", err)
		os.Exit(1)
	}
}

// Perturb adds N(0, 0.1²) draws from r to every parameter: weights larger
// than the initialisation's, norm weights and biases away from 1 and 0, so
// every term of every gradient carries signal.
func Perturb(r *rand.Rand, params []float32) {
	for i := range params {
		params[i] += float32(r.NormFloat64() * 0.1)
	}
}

// NewBatch draws b sequences of t tokens and their targets from r, below
// vocab.
func NewBatch(r *rand.Rand, b, t, vocab int) Batch {
	bt := Batch{B: b, T: t}
	for i := 0; i < b*t; i++ {
		bt.Inputs = append(bt.Inputs, uint32(r.IntN(vocab)))
		bt.Targets = append(bt.Targets, uint32(r.IntN(vocab)))
	}
	return bt
}

// Out collects the tensors of go.safetensors.
type Out struct {
	tensors []checkpoint.Tensor
}

// Add adds a copy of data as name.
func (o *Out) Add(name string, shape []int, data []float32) {
	o.tensors = append(o.tensors, checkpoint.Tensor{Name: name, Shape: shape, Data: append([]float32(nil), data...)})
}

// Pass runs bt through m and adds what it computes: "logits" (B×T×vocab,
// from a pass without targets), "loss", and "grad."+name for every
// parameter's gradient (cleared first) by its Hugging Face name.
func (o *Out) Pass(m Model, bt Batch, vocab int) error {
	if _, err := m.Forward(bt.Inputs, nil, bt.B, bt.T); err != nil {
		return err
	}
	o.Add("logits", []int{bt.B, bt.T, vocab}, m.Logits())
	loss, err := m.Forward(bt.Inputs, bt.Targets, bt.B, bt.T)
	if err != nil {
		return err
	}
	o.Add("loss", []int{1}, []float32{loss})
	m.ZeroGrad()
	if err := m.Backward(); err != nil {
		return err
	}
	for _, g := range m.HFGradTensors() {
		o.Add("grad."+g.Name, g.Shape, g.Data)
	}
	return nil
}

// Write writes the tensors to dir/go.safetensors and run (the program's
// record of the batch and its settings) to dir/run.json.
func (o *Out) Write(ctx context.Context, dir string, run any) error {
	if err := checkpoint.Save(ctx, filepath.Join(dir, "go.safetensors"), o.tensors, nil); err != nil {
		return err
	}
	b, err := json.MarshalIndent(run, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644)
}
