package tokenizer

import "errors"

// Sentinel errors; test with errors.Is. Returned errors wrap them with the
// file name and the JSON field.
var (
	// ErrUnsupported: the tokenizer.json asks for something this package
	// does not implement (a WordPiece or Unigram model, an unknown
	// pre-tokenizer regex, a normalizer it lacks).
	ErrUnsupported = errors.New("tokenizer: unsupported")
	// ErrMalformed: the tokenizer.json is not valid (bad JSON, a merge of
	// tokens that are not in the vocabulary, duplicate ids).
	ErrMalformed = errors.New("tokenizer: malformed tokenizer.json")
	// ErrTooLarge: the tokenizer.json exceeds a limit in limits.go.
	ErrTooLarge = errors.New("tokenizer: too large")
	// ErrUnknownToken: the text holds a character the vocabulary cannot
	// express (no byte fallback and no unk token), or Decode got an id
	// outside the vocabulary.
	ErrUnknownToken = errors.New("tokenizer: unknown token")
)
