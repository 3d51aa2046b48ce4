// Package hfcheck holds tests of psyche's own models against Hugging Face's
// transformers, run as a real Python process in the torch engine's pinned
// environment (bash scripts/setup-torch): the Go GPT and Llama and the torch
// worker's transcriptions of them against GPT2LMHeadModel and
// LlamaForCausalLM on the same weights, and Hugging Face checkpoints both
// ways (one psyche writes loaded by transformers, one transformers writes
// loaded by psyche). hfcheck.py is the Python side. The package has no code
// of its own: only the tests.
package hfcheck
