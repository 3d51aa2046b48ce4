// Package llama is a Llama-family decoder (the architecture of Hugging
// Face's LlamaForCausalLM) with explicit forward and backward passes on the
// kernels of trainer/kernels: token embeddings without position embeddings,
// pre-norm blocks of RMSNorm, causal grouped-query self-attention with rotary
// position embeddings (rotate-half layout, configurable θ) and a SwiGLU MLP,
// a final RMSNorm and an output head that is either its own matrix or the
// embedding matrix (tied). No layer has a bias.
//
// Parameters live in one float32 buffer, tensor after tensor (Specs), so the
// optimizers and the DisTrO compressor see the model as GPT's: a list of
// tensors. Each tensor stacks its layers; the query, key and value
// projections of a layer are one matrix (one matrix product) and so are the
// gate and up projections. hf.go maps these to and from Hugging Face's
// per-layer tensor names.
package llama
