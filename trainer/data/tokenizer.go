package data

import "fmt"

// ByteVocabSize is the vocabulary size of the byte-level tokenizer: one token
// per byte value.
const ByteVocabSize = 256

// Tokenize turns text into byte-level tokens: token i is the value of byte i.
// It never fails, so any text (including invalid UTF-8) round-trips.
func Tokenize(text []byte) []uint32 {
	tokens := make([]uint32, len(text))
	for i, b := range text {
		tokens[i] = uint32(b)
	}
	return tokens
}

// Detokenize turns byte-level tokens back into text. A token that is not a
// byte value fails with ErrTokenRange.
func Detokenize(tokens []uint32) ([]byte, error) {
	text := make([]byte, len(tokens))
	for i, t := range tokens {
		if t >= ByteVocabSize {
			return nil, fmt.Errorf("%w: token %d at position %d is not a byte (vocabulary %d)", ErrTokenRange, t, i, ByteVocabSize)
		}
		text[i] = byte(t)
	}
	return text, nil
}
