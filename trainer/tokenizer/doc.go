// Package tokenizer reads Hugging Face tokenizer.json files of BPE models and
// turns text into the token ids the trainer learns from.
//
// Two families are supported, the two that today's Llama-family models use:
//
//   - byte-level BPE (GPT-2, Llama 3): the text is split by the model's
//     pre-tokenizer regex, every piece's UTF-8 bytes are mapped to printable
//     characters and merged by rank;
//   - SentencePiece-style BPE (Llama 2, Mistral): spaces become "▁", a "▁" is
//     prepended, characters are merged by rank, and a character the
//     vocabulary lacks falls back to its UTF-8 bytes as <0xNN> tokens.
//
// Added tokens (special or not) are matched in the raw text first, leftmost
// and longest, and never split. The text between them is normalized
// (Prepend, Replace, and the Unicode forms NFC, NFD, NFKC and NFKD),
// pre-tokenized and merged. A TemplateProcessing post-processor adds its
// special tokens (Llama 2's <s>, Llama 3.1's <|begin_of_text|>) when Encode
// is asked to.
//
// # Pre-tokenizer regexes
//
// Go's regexp has no lookahead, and the regexes of byte-level tokenizers use
// one (\s+(?!\S)). The two regexes in use, GPT-2's and the one of Llama 3
// (and cl100k), are therefore implemented by hand in pretokenize.go, with the
// semantics of the Oniguruma engine that Hugging Face's tokenizers uses:
// leftmost-first alternation, greedy quantifiers with backtracking, \p{L}
// and \p{N} the Unicode general categories, \s the Unicode White_Space
// property. A tokenizer.json with any other regex is refused
// (ErrUnsupported) rather than split differently.
//
// Known difference from JavaScript ports (transformers.js): JavaScript's \s
// includes U+FEFF and excludes U+0085; Oniguruma's, and ours, the reverse. The
// case-insensitive contractions (?i:'s|…) fold ASCII letters only, as the
// JavaScript port does (Oniguruma would also fold ſ U+017F to s).
//
// # Limits
//
// Parse refuses input beyond the limits in limits.go (file size, vocabulary
// size, token length, merges, added tokens) with ErrTooLarge, so a hostile
// tokenizer.json cannot exhaust memory.
package tokenizer
