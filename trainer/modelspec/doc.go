// Package modelspec owns what a run's description of its model
// (coordinator.Model: what the coordinator account stores and run files
// set) says without building the model: the network's shape for each
// architecture (GPTConfig, LlamaConfig: their tensors, parameter counts and
// FLOPs per token; TransformersConfig, the account's mirror of a Hugging Face
// config.json, whose fields and hash ParseTransformersFile and ConfigHash
// read from its bytes), the translation between the account's fields and those
// shapes (ModelConfig, GPT, Llama and their setters, Check), the DisTrO
// optimizer's options (Distro), and where the model starts (ParseSource:
// seed:N, seed:N@config.json, file://, http(s)://, s3://).
//
// It is pure (no clock, files, network or randomness) and imports neither
// the models nor their kernels, so a part that only reads a run (the
// explorer counting parameters, the federated server checking a checkpoint
// URL) does not compile the trainer. trainer/gpt and trainer/llama build
// networks of these shapes (their Config is this package's), and
// trainer/runmodel builds, loads and saves the run's model from them.
package modelspec
