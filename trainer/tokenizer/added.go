package tokenizer

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is a token matched in the raw text before anything else.
type addedToken struct {
	content        string
	id             uint32
	lstrip, rstrip bool
	singleWord     bool
}

// addedVocab finds added tokens in text: leftmost first, and the longest
// of those that start at the same place.
type addedVocab struct {
	tokens    []addedToken
	byContent map[string]*addedToken
	ids       map[uint32]bool
	first     [256][]*addedToken // by first byte, longest first
}

func (v *addedVocab) add(a addedToken) {
	if v.byContent == nil {
		v.byContent, v.ids = map[string]*addedToken{}, map[uint32]bool{}
	}
	v.tokens = append(v.tokens, a)
	v.ids[a.id] = true
	// Rebuild the pointers: appending may have moved the slice.
	clear(v.byContent)
	v.first = [256][]*addedToken{}
	for i := range v.tokens {
		tok := &v.tokens[i]
		v.byContent[tok.content] = tok
		v.first[tok.content[0]] = append(v.first[tok.content[0]], tok)
	}
	for i := range v.first {
		slices.SortStableFunc(v.first[i], func(a, b *addedToken) int { return len(b.content) - len(a.content) })
	}
}

func (v *addedVocab) isAdded(id uint32) bool { return v.ids[id] }

// split calls fn with the pieces of text in order: plain text (added nil)
// and added tokens, stripping white space beside tokens with lstrip or
// rstrip. It stops when fn returns false.
func (v *addedVocab) split(text string, fn func(s string, added *addedToken) bool) {
	if len(v.tokens) == 0 {
		fn(text, nil)
		return
	}
	start := 0 // start of the pending plain text
	for i := 0; i < len(text); {
		tok := v.match(text, i)
		if tok == nil {
			i++
			continue
		}
		plain := text[start:i]
		if tok.lstrip {
			plain = strings.TrimRightFunc(plain, unicode.IsSpace)
		}
		if plain != "" && !fn(plain, nil) {
			return
		}
		if !fn(tok.content, tok) {
			return
		}
		i += len(tok.content)
		if tok.rstrip {
			i += len(text[i:]) - len(strings.TrimLeftFunc(text[i:], unicode.IsSpace))
		}
		start = i
	}
	if start < len(text) {
		fn(text[start:], nil)
	}
}

// match returns the longest added token at text[i:], or nil.
func (v *addedVocab) match(text string, i int) *addedToken {
	for _, tok := range v.first[text[i]] {
		if !strings.HasPrefix(text[i:], tok.content) {
			continue
		}
		if tok.singleWord {
			before, _ := utf8.DecodeLastRuneInString(text[:i])
			after, _ := utf8.DecodeRuneInString(text[i+len(tok.content):])
			if (i > 0 && !unicode.IsSpace(before)) || (i+len(tok.content) < len(text) && !unicode.IsSpace(after)) {
				continue
			}
		}
		return tok
	}
	return nil
}
