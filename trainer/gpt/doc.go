// Package gpt owns the language model: a GPT-style decoder (token and
// position embeddings, pre-norm blocks of causal self-attention and a GELU
// MLP with residuals, a final norm, and an output head tied to the token
// embedding) with explicit forward and backward passes over the kernels of
// package kernels. Parameters and gradients each live in one contiguous
// float32 buffer with a named view per tensor, which is what the optimizers,
// DisTrO and checkpoints work on.
package gpt
