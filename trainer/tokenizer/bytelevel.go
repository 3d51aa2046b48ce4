package tokenizer

// The byte-level alphabet of GPT-2: every byte maps to a printable
// character, so a token's bytes can be written as a string in vocab.json.
// Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves;
// the other 68 bytes, in order, map to U+0100, U+0101, … (so ' ' is 'Ġ').
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	n := 0
	for b := range 256 {
		if ('!' <= b && b <= '~') || ('¡' <= b && b <= '¬') || ('®' <= b && b <= 'ÿ') {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// fromByteLevel returns the bytes a byte-level token string stands for, or
// false when s holds a character outside the alphabet.
func fromByteLevel(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := runeToByte[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}
