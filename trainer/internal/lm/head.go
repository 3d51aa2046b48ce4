package lm

import "github.com/psyche-go/psyche/trainer/kernels"

// Head is the output layer's state a model keeps from a forward pass to
// the next: the per-token losses and, after a pass without targets, every
// row's logits, on the backend and as host copies. A model makes one per
// batch shape (NewHead) in the arena of its forward activations.
type Head struct {
	be                 kernels.Backend
	arena              *Arena
	rows, width, vocab int
	scratch            kernels.Tensor // HeadRows(vocab, rows) rows of logits
	full               kernels.Tensor // all rows' logits, made by the first pass without targets
	losses             kernels.Tensor
	hostLosses         []float32 // the last pass with targets' losses
	hostLogits         []float32 // a host copy of full, made by Logits
}

// NewHead allocates, in arena, the output layer's buffers for rows rows of
// width values and a vocabulary of vocab tokens.
func NewHead(be kernels.Backend, arena *Arena, rows, width, vocab int) Head {
	return Head{be: be, arena: arena, rows: rows, width: width, vocab: vocab,
		losses: arena.Alloc(rows), scratch: arena.Alloc(HeadRows(vocab, rows) * vocab),
		hostLosses: make([]float32, rows)}
}

// Forward computes the output layer over in (rows×width) and the head w
// (vocab×width): with targets, the mean cross-entropy loss of predicting
// them; without (nil), every row's logits (for Logits) and 0.
func (h *Head) Forward(in, w kernels.Tensor, targets []uint32) float32 {
	h.hostLogits = nil
	if targets == nil {
		if h.full.Len() == 0 {
			h.full = h.arena.Alloc(h.rows * h.vocab)
		}
		Matmul(h.be, h.full, in, w, kernels.Tensor{}, h.rows, h.width, h.vocab)
		return 0
	}
	HeadLoss(h.be, h.losses, h.scratch, in, w, targets, h.rows, h.width, h.vocab)
	h.be.Download(h.hostLosses, h.losses)
	return MeanLoss(h.hostLosses)
}

// Backward adds the gradient of the mean loss over targets (the last
// Forward's) to dIn and dW.
func (h *Head) Backward(dIn, dW, in, w kernels.Tensor, targets []uint32) {
	HeadBackward(h.be, dIn, dW, h.losses, h.scratch, in, w, targets, h.rows, h.width, h.vocab, 1/float32(h.rows))
}

// SequenceLosses returns each sequence's loss (the mean over its t
// positions) of the last Forward with targets.
func (h *Head) SequenceLosses(t int) []float32 { return SequenceLosses(h.hostLosses, t) }

// Logits returns the output of the last Forward without targets (rows of
// vocab logits). On a device backend it is a host copy, made on the first
// call after a Forward.
func (h *Head) Logits() []float32 {
	if kernels.InHostMemory(h.be) {
		return h.full.Host()
	}
	if h.hostLogits == nil {
		h.hostLogits = make([]float32, h.full.Len())
		h.be.Download(h.hostLogits, h.full)
	}
	return h.hostLogits
}

// ChunkRows is how many rows of logits the output layer computes at a time.
func (h *Head) ChunkRows() int { return h.scratch.Len() / h.vocab }

// Matmul computes out = in·wᵀ (+ bias, when it has values) for rows rows:
// in is rows×ic, w is oc×ic.
func Matmul(be kernels.Backend, out, in, w, bias kernels.Tensor, rows, ic, oc int) {
	be.Gemm(false, true, rows, oc, ic, 1, in, ic, w, ic, 0, out, oc)
	if bias.Len() > 0 {
		be.AddBias(out, bias, rows, oc)
	}
}

// MatmulBackward accumulates Matmul's gradients: dIn += dOut·w,
// dW += dOutᵀ·in and, when it has values, dBias += Σ dOut.
func MatmulBackward(be kernels.Backend, dIn, dW, dBias, dOut, in, w kernels.Tensor, rows, ic, oc int) {
	be.Gemm(false, false, rows, ic, oc, 1, dOut, oc, w, ic, 1, dIn, ic)
	be.Gemm(true, false, oc, ic, rows, 1, dOut, oc, in, ic, 1, dW, ic)
	if dBias.Len() > 0 {
		be.BiasBackward(dBias, dOut, rows, oc)
	}
}

// Layer is layer l's part of a tensor that stacks every layer's n values.
func Layer(v kernels.Tensor, l, n int) kernels.Tensor { return v.Slice(l*n, (l+1)*n) }

// HostLayer is Layer for a host buffer.
func HostLayer(v []float32, l, n int) []float32 { return v[l*n : (l+1)*n] }

// AttentionProbs returns what gives each layer's activations their
// attention probabilities, n values: a tensor of its own for each layer
// when keep (a forward pass keeps them for the backward one), else one
// tensor all layers share (their gradient is scratch within one layer's
// backward pass: a 1B model at 2048 tokens holds 8.6 GB less).
func (a *Arena) AttentionProbs(n int, keep bool) func() kernels.Tensor {
	if keep {
		return func() kernels.Tensor { return a.Alloc(n) }
	}
	shared := a.Alloc(n)
	return func() kernels.Tensor { return shared }
}
