package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizer regexes this package implements, exactly as they appear
// in tokenizer.json files.
const (
	// PatternGPT2 is GPT-2's regex, used by a ByteLevel pre-tokenizer with
	// use_regex true.
	PatternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// PatternLlama3 is the regex of Llama 3 (and OpenAI's cl100k), used by a
	// Split pre-tokenizer.
	PatternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitter cuts s into the consecutive matches of a pre-tokenizer regex and
// calls emit with each piece's byte range. The pieces cover s exactly.
type splitter func(s string, emit func(start, end int))

// splitters maps each supported regex to its hand-written implementation.
var splitters = map[string]splitter{
	PatternGPT2:   splitGPT2,
	PatternLlama3: splitLlama3,
}

// Character classes. A byte that is not valid UTF-8 is a class of its own
// that is none of letter, number or space (like a punctuation mark), one
// byte long, so any input splits into pieces that cover it.
const (
	clsOther = iota
	clsLetter
	clsNumber
	clsSpace // White_Space, but not \r or \n
	clsNewline
)

var asciiClass [128]uint8

func init() {
	for c := range 128 {
		r := rune(c)
		switch {
		case r == '\r' || r == '\n':
			asciiClass[c] = clsNewline
		case unicode.Is(unicode.White_Space, r):
			asciiClass[c] = clsSpace
		case unicode.IsLetter(r):
			asciiClass[c] = clsLetter
		case unicode.IsNumber(r):
			asciiClass[c] = clsNumber
		default:
			asciiClass[c] = clsOther
		}
	}
}

// classAt returns the class of the character at s[i:] and its length in
// bytes (1 for an invalid byte).
func classAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case r == utf8.RuneError && n <= 1:
		return clsOther, 1
	case unicode.IsLetter(r):
		return clsLetter, n
	case unicode.IsNumber(r):
		return clsNumber, n
	case unicode.Is(unicode.White_Space, r):
		return clsSpace, n // \r and \n are ASCII
	}
	return clsOther, n
}

func isSpaceClass(c uint8) bool { return c == clsSpace || c == clsNewline }

// runOf returns the end of the run of characters from i whose class
// satisfies in, and how many characters it holds (stopping after max
// characters when max > 0).
func runOf(s string, i int, in func(uint8) bool, max int) (end, count int) {
	for i < len(s) && (max <= 0 || count < max) {
		c, n := classAt(s, i)
		if !in(c) {
			break
		}
		i += n
		count++
	}
	return i, count
}

func isLetter(c uint8) bool  { return c == clsLetter }
func isNumber(c uint8) bool  { return c == clsNumber }
func isOther(c uint8) bool   { return c == clsOther }
func isNewline(c uint8) bool { return c == clsNewline }

// contraction matches 's 't 're 've 'm 'll 'd at s[i:] (ASCII letters,
// case-folded when fold is set) and returns its end, or -1.
func contraction(s string, i int, fold bool) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return -1
	}
	lower := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return i + 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return i + 3
		}
	}
	return -1
}

// trailingSpace implements \s+(?!\S) then \s+ at s[i:], where s[i] is
// white space: the run of white space, less its last character when a
// non-space follows and the run is longer than one character.
func trailingSpace(s string, i int) int {
	end, _ := runOf(s, i, isSpaceClass, 0)
	if end == len(s) {
		return end
	}
	// Back off one character so that the space before a word stays with
	// the word; a single space cannot back off (\s+ needs one), and then
	// the last alternative \s+ takes it.
	_, last := lastRune(s[i:end])
	if end-last > i {
		return end - last
	}
	return end
}

// lastRune returns the last character of s (which is white space, so valid
// UTF-8) and its length.
func lastRune(s string) (rune, int) { return utf8.DecodeLastRuneInString(s) }

// splitGPT2 implements PatternGPT2:
//
//	's|'t|'re|'ve|'m|'ll|'d | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
func splitGPT2(s string, emit func(start, end int)) {
	for i := 0; i < len(s); {
		end := gpt2At(s, i)
		emit(i, end)
		i = end
	}
}

func gpt2At(s string, i int) int {
	if end := contraction(s, i, false); end > 0 {
		return end
	}
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		j = i + 1 // " ?" before a letter, number or other run
	}
	c, _ := classAt(s, j)
	if j > i && isSpaceClass(c) {
		j, c = i, clsSpace // " ?" not followed by a run: no optional space
	}
	switch c {
	case clsLetter:
		end, _ := runOf(s, j, isLetter, 0)
		return end
	case clsNumber:
		end, _ := runOf(s, j, isNumber, 0)
		return end
	case clsOther:
		end, _ := runOf(s, j, isOther, 0)
		return end
	}
	return trailingSpace(s, i)
}

// splitLlama3 implements PatternLlama3:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} |
//	 ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
func splitLlama3(s string, emit func(start, end int)) {
	for i := 0; i < len(s); {
		end := llama3At(s, i)
		emit(i, end)
		i = end
	}
}

func llama3At(s string, i int) int {
	if end := contraction(s, i, true); end > 0 {
		return end
	}
	c, n := classAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == clsLetter {
		end, _ := runOf(s, i, isLetter, 0)
		return end
	}
	if c != clsNumber && c != clsNewline && i+n < len(s) {
		if next, _ := classAt(s, i+n); next == clsLetter {
			end, _ := runOf(s, i+n, isLetter, 0)
			return end
		}
	}
	// \p{N}{1,3}
	if c == clsNumber {
		end, _ := runOf(s, i, isNumber, 3)
		return end
	}
	// " ?[^\s\p{L}\p{N}]+[\r\n]*"
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		if next, _ := classAt(s, i+1); next == clsOther {
			j = i + 1
		}
	}
	if cj, _ := classAt(s, j); cj == clsOther {
		end, _ := runOf(s, j, isOther, 0)
		end, _ = runOf(s, end, isNewline, 0)
		return end
	}
	// Only white space is left: \s*[\r\n]+ takes the run up to and
	// including its last newline, if it has one.
	end, _ := runOf(s, i, isSpaceClass, 0)
	if nl := lastNewline(s[i:end]); nl >= 0 {
		return i + nl + 1
	}
	return trailingSpace(s, i)
}

// lastNewline returns the index of the last \r or \n in s, or -1.
func lastNewline(s string) int {
	for k := len(s) - 1; k >= 0; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k
		}
	}
	return -1
}
