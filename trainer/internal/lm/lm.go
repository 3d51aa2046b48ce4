// Package lm holds what the language models (trainer/gpt, trainer/llama)
// share: parameter buffers split into tensors, their initialisation, the
// checks on a batch, activation arenas, matrix products and their
// gradients, the output layer (Head: chunked logits, losses, their
// gradient) and the checkpoint plumbing (Save, CheckShape, FromCheckpoint).
// A model keeps only what is its own: its tensors, its layers' passes and
// their Hugging Face names.
package lm

import (
	"fmt"
	"math/rand/v2"

	"github.com/psyche-go/psyche/trainer/kernels"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// Split points each dst[i] at the next modelspec.Size(shapes[i]) elements of buf (with
// the capacity cut to the length) and returns the views, in order.
func Split(buf []float32, shapes [][]int, dst []*[]float32) [][]float32 {
	var all [][]float32
	off := 0
	for i, s := range shapes {
		n := modelspec.Size(s)
		*dst[i] = buf[off : off+n : off+n]
		all = append(all, *dst[i])
		off += n
	}
	return all
}

// Normal fills v with draws from N(0, std²) taken from r, in order.
func Normal(r *rand.Rand, v []float32, std float64) {
	for i := range v {
		v[i] = float32(r.NormFloat64() * std)
	}
}

// Ones fills v with 1.
func Ones(v []float32) {
	for i := range v {
		v[i] = 1
	}
}

// CheckBatch checks a batch of b sequences of t tokens for a model of the
// given context and vocabulary: inputs must be b·t token ids below vocab and
// targets nil or as many, below vocab too. Errors start with pkg.
func CheckBatch(pkg string, inputs, targets []uint32, b, t, context, vocab int) error {
	if b <= 0 || t <= 0 || t > context {
		return fmt.Errorf("%s: batch %d×%d does not fit a context of %d", pkg, b, t, context)
	}
	if len(inputs) != b*t || (targets != nil && len(targets) != b*t) {
		return fmt.Errorf("%s: %d inputs and %d targets for a batch of %d×%d", pkg, len(inputs), len(targets), b, t)
	}
	for _, tok := range inputs {
		if int(tok) >= vocab {
			return fmt.Errorf("%s: token %d outside the vocabulary of %d", pkg, tok, vocab)
		}
	}
	for _, tok := range targets {
		if int(tok) >= vocab {
			return fmt.Errorf("%s: target %d outside the vocabulary of %d", pkg, tok, vocab)
		}
	}
	return nil
}

// MeanLoss is the mean of the per-token losses, summed in float64.
func MeanLoss(losses []float32) float32 {
	var sum float64
	for _, l := range losses {
		sum += float64(l)
	}
	return float32(sum / float64(len(losses)))
}

// SequenceLosses returns the mean of each row of t per-token losses (a
// sequence's loss), summed in float64 as MeanLoss sums the whole batch.
func SequenceLosses(losses []float32, t int) []float32 {
	out := make([]float32, len(losses)/t)
	for i := range out {
		var sum float64
		for _, l := range losses[i*t : (i+1)*t] {
			sum += float64(l)
		}
		out[i] = float32(sum / float64(t))
	}
	return out
}

// Buffers are a model's parameters and gradients, each one buffer in host
// memory and the tensors they split into, and the same two buffers as the
// model's backend keeps them (on a host backend, the same memory). A model
// embeds them.
//
// The host buffers are what the optimizers, checkpoints and the P2P
// exchange read and write; the backend's are what the kernels use. They
// meet twice a step: Forward uploads the parameters (ToBackend), and
// Backward downloads the gradients (FromBackend). On a host backend both
// are nothing.
type Buffers struct {
	Params  []float32 // all parameters, in the model's tensor order
	Grads   []float32 // all gradients, same layout
	pTensor [][]float32
	gTensor [][]float32

	be         kernels.Backend
	onHost     bool
	dp, dg     kernels.Tensor // Params and Grads on the backend
	gradsClean bool           // dg holds zeros (ZeroGrad since the last Backward)
}

// NewBuffers allocates n parameters and n zero gradients, on the host and
// on be, and splits each host buffer with views, which returns the model's
// named views and the tensors in order; it returns the buffers and the named
// views of both.
func NewBuffers[P any](be kernels.Backend, n int, views func([]float32) (P, [][]float32)) (b Buffers, p, g P) {
	b.Params = make([]float32, n)
	b.Grads = make([]float32, n)
	p, b.pTensor = views(b.Params)
	g, b.gTensor = views(b.Grads)
	b.be, b.onHost = be, kernels.InHostMemory(be)
	if b.onHost {
		b.dp, b.dg = kernels.HostTensor(b.Params), kernels.HostTensor(b.Grads)
	} else {
		b.dp, b.dg = be.Alloc(n), be.Alloc(n)
		// Both cross to the device every step: page-locked, they cross
		// several times faster. Without it (the system's limit on locked
		// memory, say) they still cross.
		_ = kernels.Pin(be, b.Params)
		_ = kernels.Pin(be, b.Grads)
	}
	b.gradsClean = true
	return b, p, g
}

// Tensors returns the parameter tensors (views into Params), in order.
func (b *Buffers) Tensors() [][]float32 { return b.pTensor }

// GradTensors returns the gradient tensors (views into Grads), in order.
func (b *Buffers) GradTensors() [][]float32 { return b.gTensor }

// ZeroGrad clears the gradients.
func (b *Buffers) ZeroGrad() {
	clear(b.Grads)
	if !b.onHost {
		b.be.Zero(b.dg)
	}
	b.gradsClean = true
}

// ParamsOnBackend and GradsOnBackend are the whole buffers as the backend
// keeps them, for the model to cut its views from.
func (b *Buffers) ParamsOnBackend() kernels.Tensor { return b.dp }

// GradsOnBackend: see ParamsOnBackend.
func (b *Buffers) GradsOnBackend() kernels.Tensor { return b.dg }

// ToBackend copies the host parameters to the backend, before a forward
// pass: whoever changed them (an optimizer, a checkpoint load, a test)
// did so in host memory.
func (b *Buffers) ToBackend() {
	if !b.onHost {
		b.be.Upload(b.dp, b.Params)
	}
}

// BeforeBackward makes the backend's gradients what the host's are, so that
// a backward pass accumulates onto them: nothing to do when they were
// cleared since (the usual step) or live in host memory.
func (b *Buffers) BeforeBackward() {
	if !b.onHost && !b.gradsClean {
		b.be.Upload(b.dg, b.Grads)
	}
}

// FromBackend copies the gradients a backward pass left on the backend to
// the host.
func (b *Buffers) FromBackend() {
	if !b.onHost {
		b.be.Download(b.Grads, b.dg)
	}
	b.gradsClean = false
}

// SplitTensor cuts t into consecutive views of the given shapes, pointing
// each dst[i] at one, as Split does for host buffers.
func SplitTensor(t kernels.Tensor, shapes [][]int, dst []*kernels.Tensor) {
	off := 0
	for i, s := range shapes {
		n := modelspec.Size(s)
		*dst[i] = t.Slice(off, off+n)
		off += n
	}
}

// Arena allocates a model's activations on its backend and gives them all
// back at once, when the batch shape changes.
type Arena struct {
	be  kernels.Backend
	all []kernels.Tensor
}

// NewArena returns an empty arena on be.
func NewArena(be kernels.Backend) *Arena { return &Arena{be: be} }

// Alloc returns n zero values, freed with the arena.
func (a *Arena) Alloc(n int) kernels.Tensor {
	t := a.be.Alloc(n)
	a.all = append(a.all, t)
	return t
}

// Zero clears every tensor allocated here.
func (a *Arena) Zero() {
	for _, t := range a.all {
		a.be.Zero(t)
	}
}

// Free gives every tensor back; the arena can be used again.
func (a *Arena) Free() {
	for _, t := range a.all {
		a.be.Free(t)
	}
	a.all = nil
}

// HeadRows is how many rows of logits the output layer computes at a time:
// as many as keep a chunk within 16 Mi values (64 MiB) and at most rows. A
// 128k-token vocabulary at 16k tokens a step would otherwise hold 8 GiB of
// logits (and their gradient); chunked, it holds 64 MiB and computes each
// chunk's logits twice (forward for the loss, backward for the gradient),
// one more product of the head's size.
func HeadRows(vocab, rows int) int {
	return max(1, min(rows, MaxHeadValues/max(1, vocab)))
}

// MaxHeadValues is the most logits HeadRows lets a chunk hold; tests lower
// it to make tiny models compute in several chunks.
var MaxHeadValues = 16 << 20

// HeadLoss computes the output layer's loss chunk by chunk: for rows rows
// of in (width wide) and the head w (vocab×width), each row's cross-entropy
// against its target into losses; the chunks are as many rows as scratch
// holds (HeadRows(vocab, rows) when the model sized it).
func HeadLoss(be kernels.Backend, losses, scratch, in, w kernels.Tensor, targets []uint32, rows, width, vocab int) {
	chunk := scratch.Len() / vocab
	for lo := 0; lo < rows; lo += chunk {
		n := min(chunk, rows-lo)
		logits := scratch.Slice(0, n*vocab)
		be.Gemm(false, true, n, vocab, width, 1, in.Slice(lo*width, (lo+n)*width), width, w, width, 0, logits, vocab)
		be.SoftmaxCrossEntropy(losses.Slice(lo, lo+n), logits, targets[lo:lo+n], n, vocab)
	}
}

// HeadBackward adds the gradient of scale·Σ losses (HeadLoss's) to dIn and
// dW, recomputing each chunk's probabilities; losses is scratch of rows
// values.
func HeadBackward(be kernels.Backend, dIn, dW, losses, scratch, in, w kernels.Tensor, targets []uint32, rows, width, vocab int, scale float32) {
	chunk := scratch.Len() / vocab
	for lo := 0; lo < rows; lo += chunk {
		n := min(chunk, rows-lo)
		logits, x := scratch.Slice(0, n*vocab), in.Slice(lo*width, (lo+n)*width)
		be.Gemm(false, true, n, vocab, width, 1, x, width, w, width, 0, logits, vocab)
		be.SoftmaxCrossEntropy(losses.Slice(lo, lo+n), logits, targets[lo:lo+n], n, vocab)
		// The logits' gradient, in place over the probabilities.
		be.CrossEntropyBackward(logits, logits, targets[lo:lo+n], n, vocab, scale)
		be.Gemm(false, false, n, width, vocab, 1, logits, vocab, w, width, 1, dIn.Slice(lo*width, (lo+n)*width), width)
		be.Gemm(true, false, vocab, width, n, 1, logits, vocab, x, width, 1, dW, width)
	}
}
