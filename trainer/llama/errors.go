package llama

import "errors"

// Sentinel errors of the Hugging Face checkpoint reader. Messages name the
// file and the tensor or field.
var (
	// ErrHFConfig means a config.json is unreadable or describes a model
	// this trainer does not build (another model type, activation, biases,
	// rope scaling, a head size other than hidden_size/heads).
	ErrHFConfig = errors.New("llama: unsupported or invalid Hugging Face config")
	// ErrHFMismatch means the tensors of a checkpoint disagree with its
	// config.json: a missing or extra tensor, a shape or a dtype other than
	// the config's, or an index that names a file that does not hold it.
	ErrHFMismatch = errors.New("llama: checkpoint tensors do not match config.json")
)
