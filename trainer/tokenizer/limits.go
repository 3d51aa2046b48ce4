package tokenizer

// Production limits on a tokenizer.json. The largest tokenizers in use are
// well inside them (Llama 3: 9 MB, 128,256 ids, 280,147 merges, 256 added
// tokens; Gemma: 33 MB, 256,000 ids).
const (
	// MaxFileBytes bounds the size of a tokenizer.json.
	MaxFileBytes = 256 << 20
	// MaxVocabSize bounds the number of ids (the largest id + 1): four
	// times Gemma's, and a decoded vocabulary of at most ~100 MB.
	MaxVocabSize = 1 << 20
	// MaxTokenBytes bounds the length of one token or added token.
	MaxTokenBytes = 1 << 12
	// MaxMerges bounds the number of merges (3.7 times Llama 3's).
	MaxMerges = 1 << 20
	// MaxAddedTokens bounds the number of added tokens.
	MaxAddedTokens = 1 << 16
	// MaxNesting bounds Sequence normalizers/pre-tokenizers/processors.
	MaxNesting = 8
	// MaxNormalizerGrowth bounds how many times longer the normalizers'
	// Replace steps can make a text: the product over them of the
	// replacement's length over the pattern's (when longer). Llama 2's
	// " " → "▁" is 3; four chained Replaces of "e" by 1,000 "e" would be
	// 10¹² (a few bytes of text would need terabytes).
	MaxNormalizerGrowth = 64
)
