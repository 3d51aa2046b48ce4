package tokenizer

// Production limits on a tokenizer.json. The largest tokenizers in use are
// well inside them (Llama 3: 9 MB, 128,256 ids, 280,147 merges, 256 added
// tokens; Gemma: 33 MB, 256,000 ids).
const (
	// MaxFileBytes bounds the size of a tokenizer.json.
	MaxFileBytes = 256 << 20
	// MaxVocabSize bounds the number of ids (the largest id + 1).
	MaxVocabSize = 1 << 22
	// MaxTokenBytes bounds the length of one token or added token.
	MaxTokenBytes = 1 << 12
	// MaxMerges bounds the number of merges.
	MaxMerges = 1 << 22
	// MaxAddedTokens bounds the number of added tokens.
	MaxAddedTokens = 1 << 16
	// MaxNesting bounds Sequence normalizers/pre-tokenizers/processors.
	MaxNesting = 8
)
