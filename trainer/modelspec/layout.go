package modelspec

import (
	"fmt"
	"strconv"
)

// A Piece is one tensor of a checkpoint file as a part of one of the
// model's parameter tensors (Specs order): Size(Shape) values from Offset
// of tensor Tensor. Our parameters are stacked per layer and fused where
// the arithmetic is (a Llama's query, key and value rows are one matrix);
// a Hugging Face checkpoint names each layer's projections apart. Listing
// the file's tensors as pieces lets whoever holds the parameters (a host
// model, a worker's device) hand out each one as it is written or hashed,
// without the whole model being copied first.
type Piece struct {
	Name           string
	Shape          []int
	Tensor, Offset int
	// Transposed: the file holds the part's matrix transposed (GPT-2's
	// Conv1D weights are in×out, ours out×in); Shape is the file's.
	Transposed bool
}

// Values is the piece's values cut from the parameters: a view into them,
// or a transposed copy.
func (p Piece) Values(params [][]float32) []float32 {
	v := params[p.Tensor][p.Offset : p.Offset+Size(p.Shape)]
	if !p.Transposed {
		return v
	}
	return Transpose(v, p.Shape[1], p.Shape[0])
}

// Transpose is the cols×rows transpose of a rows×cols matrix.
func Transpose(m []float32, rows, cols int) []float32 {
	out := make([]float32, len(m))
	for r := range rows {
		for c := range cols {
			out[c*rows+r] = m[r*cols+c]
		}
	}
	return out
}

// CheckPieces says whether pieces cut exactly within tensors of shapes.
func CheckPieces(pieces []Piece, shapes [][]int) error {
	for _, p := range pieces {
		if p.Tensor < 0 || p.Tensor >= len(shapes) {
			return fmt.Errorf("modelspec: piece %s of tensor %d, the model has %d", p.Name, p.Tensor, len(shapes))
		}
		if n := Size(shapes[p.Tensor]); p.Offset < 0 || p.Offset+Size(p.Shape) > n {
			return fmt.Errorf("modelspec: piece %s takes [%d, %d) of a tensor of %d values", p.Name, p.Offset, p.Offset+Size(p.Shape), n)
		}
		if p.Transposed && len(p.Shape) != 2 {
			return fmt.Errorf("modelspec: transposed piece %s of shape %v", p.Name, p.Shape)
		}
	}
	return nil
}

// WholePieces are the pieces of a checkpoint that holds each tensor whole,
// under its own name (our own checkpoint files, a transformers model's).
func WholePieces(names []string, shapes [][]int) []Piece {
	out := make([]Piece, len(names))
	for i := range names {
		out[i] = Piece{Name: names[i], Shape: shapes[i], Tensor: i}
	}
	return out
}

// Pieces are the tensors of our own GPT checkpoint file: the parameters as
// they are, named as Specs names them.
func (c GPTConfig) Pieces() []Piece {
	specs := c.Specs()
	out := make([]Piece, len(specs))
	for i, s := range specs {
		out[i] = Piece{Name: s.Name, Shape: s.Shape, Tensor: i}
	}
	return out
}

// HFPieces are the tensors of a Hugging Face GPT-2 checkpoint, in the
// order transformers lists them: per layer, the norms and biases as slices
// of ours and the linear weights transposed (Conv1D).
func (c GPTConfig) HFPieces() []Piece {
	C, L := c.Width, c.Layers
	// Specs' indices.
	const (
		wte = iota
		wpe
		ln1w
		ln1b
		qkvw
		qkvb
		projw
		projb
		ln2w
		ln2b
		fcw
		fcb
		fcprojw
		fcprojb
		lnfw
		lnfb
	)
	out := []Piece{
		{Name: "transformer.wte.weight", Shape: []int{c.Vocab, C}, Tensor: wte},
		{Name: "transformer.wpe.weight", Shape: []int{c.Context, C}, Tensor: wpe},
	}
	for l := range L {
		pre := "transformer.h." + strconv.Itoa(l) + "."
		vec := func(name string, t, n int) Piece {
			return Piece{Name: pre + name, Shape: []int{n}, Tensor: t, Offset: l * n}
		}
		// Ours out×in, the file's in×out.
		lin := func(name string, t, out, in int) Piece {
			return Piece{Name: pre + name, Shape: []int{in, out}, Tensor: t, Offset: l * out * in, Transposed: true}
		}
		out = append(out,
			vec("ln_1.weight", ln1w, C),
			vec("ln_1.bias", ln1b, C),
			lin("attn.c_attn.weight", qkvw, 3*C, C),
			vec("attn.c_attn.bias", qkvb, 3*C),
			lin("attn.c_proj.weight", projw, C, C),
			vec("attn.c_proj.bias", projb, C),
			vec("ln_2.weight", ln2w, C),
			vec("ln_2.bias", ln2b, C),
			lin("mlp.c_fc.weight", fcw, 4*C, C),
			vec("mlp.c_fc.bias", fcb, 4*C),
			lin("mlp.c_proj.weight", fcprojw, C, 4*C),
			vec("mlp.c_proj.bias", fcprojb, C),
		)
	}
	return append(out,
		Piece{Name: "transformer.ln_f.weight", Shape: []int{C}, Tensor: lnfw},
		Piece{Name: "transformer.ln_f.bias", Shape: []int{C}, Tensor: lnfb})
}

// Pieces are the tensors of a Llama checkpoint, which is always a Hugging
// Face one, in the order transformers lists them: per layer, the norms and
// projections cut from our stacked and fused tensors (queries, keys and
// values are rows of one matrix, the gate and up projections of another).
func (c LlamaConfig) Pieces() []Piece {
	C, I, hd := c.Width, c.Intermediate, c.HeadDim()
	W := c.QKVRows()
	q, k := c.Heads*hd, c.KVHeads*hd
	// Specs' indices.
	const (
		embed = iota
		attnNorm
		qkv
		o
		mlpNorm
		gateUp
		down
		norm
		head
	)
	out := []Piece{{Name: "model.embed_tokens.weight", Shape: []int{c.Vocab, C}, Tensor: embed}}
	for l := range c.Layers {
		pre := "model.layers." + strconv.Itoa(l) + "."
		at := func(name string, t, layerSize, off int, shape ...int) Piece {
			return Piece{Name: pre + name, Shape: shape, Tensor: t, Offset: l*layerSize + off}
		}
		out = append(out,
			at("input_layernorm.weight", attnNorm, C, 0, C),
			at("self_attn.q_proj.weight", qkv, W*C, 0, q, C),
			at("self_attn.k_proj.weight", qkv, W*C, q*C, k, C),
			at("self_attn.v_proj.weight", qkv, W*C, (q+k)*C, k, C),
			at("self_attn.o_proj.weight", o, C*C, 0, C, C),
			at("post_attention_layernorm.weight", mlpNorm, C, 0, C),
			at("mlp.gate_proj.weight", gateUp, 2*I*C, 0, I, C),
			at("mlp.up_proj.weight", gateUp, 2*I*C, I*C, I, C),
			at("mlp.down_proj.weight", down, C*I, 0, C, I),
		)
	}
	out = append(out, Piece{Name: "model.norm.weight", Shape: []int{C}, Tensor: norm})
	if !c.TiedHead {
		out = append(out, Piece{Name: "lm_head.weight", Shape: []int{c.Vocab, C}, Tensor: head})
	}
	return out
}
