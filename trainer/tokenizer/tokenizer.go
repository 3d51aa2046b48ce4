package tokenizer

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer turns text into token ids as a Hugging Face tokenizer.json
// describes. It is safe for concurrent use.
type Tokenizer struct {
	vocabSize int
	normalize []normStep
	pre       []preStep
	model     *bpe
	added     addedVocab
	// template is the post-processor's single-sequence template: ids to
	// add, with seqMarker where the text's ids go. nil: add nothing.
	template []int64
	// decoded holds, per id, the bytes Decode writes for it.
	decoded [][]byte
	// stripSpace: Decode drops the space the normalizer or pre-tokenizer
	// prepended ("▁") from the start of the text.
	stripSpace bool
}

const seqMarker = -1

// normStep is one normalizer: prepend a string, or replace every
// occurrence of a string.
type normStep struct {
	prepend      string
	from, to     string
	isReplace    bool
	isPrependOne bool
	form         *norm.Form // a Unicode normalization form, when not nil
}

func (n normStep) apply(s string) string {
	switch {
	case n.form != nil:
		return n.form.String(s)
	case n.isReplace:
		return strings.ReplaceAll(s, n.from, n.to)
	}
	return n.prepend + s
}

// unicodeForms are the Unicode normalizers, by their tokenizer.json type.
var unicodeForms = map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}

// preStep is one pre-tokenizer step, applied to every piece the previous
// steps produced.
type preStep struct {
	kind           int
	split          splitter // kindSplit, and kindByteLevel with use_regex
	addPrefixSpace bool     // kindByteLevel
	replacement    string   // kindMetaspace
	prependScheme  string   // kindMetaspace: always, first or never
	splitPieces    bool     // kindMetaspace
}

const (
	kindSplit = iota
	kindByteLevel
	kindMetaspace
)

// buildVocab fills in the added tokens, the vocabulary size and the bytes
// each id decodes to.
func (t *Tokenizer) buildVocab(f *fileJSON) error {
	size := 0
	for _, id := range t.model.vocab {
		size = max(size, int(id)+1)
	}
	if len(f.AddedTokens) > MaxAddedTokens {
		return fieldError(ErrTooLarge, "added_tokens", "%d tokens, the limit is %d", len(f.AddedTokens), MaxAddedTokens)
	}
	for i, a := range f.AddedTokens {
		field := fmt.Sprintf("added_tokens[%d]", i)
		if a.ID == nil || *a.ID < 0 || *a.ID >= MaxVocabSize {
			return fieldError(ErrMalformed, field+".id", "missing or outside [0, %d)", MaxVocabSize)
		}
		if a.Content == "" {
			return fieldError(ErrMalformed, field+".content", "empty")
		}
		if len(a.Content) > MaxTokenBytes {
			return fieldError(ErrTooLarge, field+".content", "%d bytes, the limit is %d", len(a.Content), MaxTokenBytes)
		}
		t.added.add(addedToken{content: a.Content, id: uint32(*a.ID), lstrip: a.LStrip, rstrip: a.RStrip, singleWord: a.SingleWord})
		size = max(size, int(*a.ID)+1)
	}
	t.vocabSize = size
	t.decoded = make([][]byte, size)
	for tok, id := range t.model.vocab {
		if t.decoded[id] != nil {
			return fieldError(ErrMalformed, "model.vocab", "id %d belongs to both %q and %q", id, t.decoded[id], tok)
		}
		t.decoded[id] = t.decodeToken(tok)
	}
	for _, a := range t.added.tokens {
		t.decoded[a.id] = []byte(a.content)
	}
	return nil
}

// decodeToken is the text a vocabulary token stands for: its bytes for a
// byte-level model; for a SentencePiece one, "▁" as a space and <0xNN> as
// the byte NN.
func (t *Tokenizer) decodeToken(tok string) []byte {
	if t.model.byteLevel {
		return []byte(tok) // already raw bytes
	}
	if len(tok) == 6 && strings.HasPrefix(tok, "<0x") && tok[5] == '>' {
		if v, err := strconv.ParseUint(tok[3:5], 16, 8); err == nil {
			return []byte{byte(v)}
		}
	}
	for _, p := range t.pre {
		if p.kind == kindMetaspace {
			tok = strings.ReplaceAll(tok, p.replacement, " ")
		}
	}
	for _, n := range t.normalize {
		if n.isReplace && n.from == " " {
			tok = strings.ReplaceAll(tok, n.to, " ")
		}
	}
	return []byte(tok)
}

func (t *Tokenizer) parseProcessor(p processorJSON, field string, depth int) error {
	if depth > MaxNesting {
		return fieldError(ErrTooLarge, field, "nested deeper than %d", MaxNesting)
	}
	switch p.Type {
	case "ByteLevel":
		return nil // offsets only
	case "Sequence":
		for i, sub := range p.Processors {
			if err := t.parseProcessor(sub, fmt.Sprintf("%s.processors[%d]", field, i), depth+1); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		if t.template != nil {
			return fieldError(ErrUnsupported, field, "more than one TemplateProcessing")
		}
		t.template = []int64{}
		seq := 0
		for i, piece := range p.Single {
			pf := fmt.Sprintf("%s.single[%d]", field, i)
			switch {
			case piece.Sequence != nil:
				if piece.Sequence.ID != "A" {
					return fieldError(ErrMalformed, pf, "sequence %q in a single-sequence template", piece.Sequence.ID)
				}
				t.template = append(t.template, seqMarker)
				seq++
			case piece.SpecialToken != nil:
				sp, ok := p.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fieldError(ErrMalformed, pf, "special token %q is not in special_tokens", piece.SpecialToken.ID)
				}
				for _, id := range sp.IDs {
					if id < 0 || id >= int64(t.vocabSize) {
						return fieldError(ErrMalformed, pf, "special token %q has id %d, outside the vocabulary of %d", piece.SpecialToken.ID, id, t.vocabSize)
					}
					t.template = append(t.template, id)
				}
			default:
				return fieldError(ErrMalformed, pf, "neither Sequence nor SpecialToken")
			}
		}
		if seq != 1 {
			return fieldError(ErrMalformed, field+".single", "has %d sequences, want 1", seq)
		}
		return nil
	}
	return fieldError(ErrUnsupported, field+".type", "post-processor %q is not supported (TemplateProcessing, ByteLevel and Sequence are)", p.Type)
}

// VocabSize returns the number of ids: the largest id plus one.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// ID returns the id of a vocabulary or added token, as written in the
// tokenizer.json.
func (t *Tokenizer) ID(token string) (uint32, bool) {
	if a, ok := t.added.byContent[token]; ok {
		return a.id, true
	}
	if t.model.byteLevel {
		raw, ok := fromByteLevel(token)
		if !ok {
			return 0, false
		}
		token = string(raw)
	}
	id, ok := t.model.vocab[token]
	return id, ok
}

// Encode appends the ids of text to dst and returns the extended slice.
// Added tokens in the text (such as "<|end_of_text|>") become their ids.
// With addSpecial, the post-processor's template adds its special tokens
// (Llama 2's <s> before the text); Llama 3's tokenizer.json adds none. A
// character the vocabulary cannot express, when there is neither byte
// fallback nor an unk token, fails with ErrUnknownToken.
func (t *Tokenizer) Encode(dst []uint32, text string, addSpecial bool) ([]uint32, error) {
	if !addSpecial || t.template == nil {
		return t.encodeText(dst, text)
	}
	var err error
	for _, id := range t.template {
		if id != seqMarker {
			dst = append(dst, uint32(id))
			continue
		}
		if dst, err = t.encodeText(dst, text); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

func (t *Tokenizer) encodeText(dst []uint32, text string) ([]uint32, error) {
	var err error
	section := 0
	t.added.split(text, func(s string, added *addedToken) bool {
		if added != nil {
			dst = append(dst, added.id)
			return true
		}
		if s == "" {
			return true
		}
		for _, n := range t.normalize {
			s = n.apply(s)
		}
		if s == "" {
			return true
		}
		t.preTokenize(s, section, 0, func(piece string) {
			if err == nil {
				dst, err = t.model.encodeWord(dst, piece)
			}
		})
		section++
		return err == nil
	})
	return dst, err
}

// preTokenize runs pre-tokenizer steps step… on s and calls emit with each
// final piece.
func (t *Tokenizer) preTokenize(s string, section, step int, emit func(string)) {
	if step == len(t.pre) {
		emit(s)
		return
	}
	next := func(piece string) {
		if piece != "" {
			t.preTokenize(piece, section, step+1, emit)
		}
	}
	p := t.pre[step]
	switch p.kind {
	case kindSplit:
		p.split(s, func(a, b int) { next(s[a:b]) })
	case kindByteLevel:
		if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
			s = " " + s
		}
		if p.split == nil {
			next(s)
			return
		}
		p.split(s, func(a, b int) { next(s[a:b]) })
	case kindMetaspace:
		s = strings.ReplaceAll(s, " ", p.replacement)
		if (p.prependScheme == "always" || (p.prependScheme == "first" && section == 0)) && !strings.HasPrefix(s, p.replacement) {
			s = p.replacement + s
		}
		if !p.splitPieces {
			next(s)
			return
		}
		// Split before every replacement character, which starts the
		// next piece (MergedWithNext).
		start := 0
		for i := 1; i < len(s); i++ {
			if strings.HasPrefix(s[i:], p.replacement) && i > start {
				next(s[start:i])
				start = i
			}
		}
		next(s[start:])
	}
}

// Decode returns the text of ids: the inverse of Encode for text without
// added tokens (special tokens decode to their content). An id outside the
// vocabulary fails with ErrUnknownToken.
func (t *Tokenizer) Decode(ids []uint32) ([]byte, error) {
	var out []byte
	for i, id := range ids {
		if int(id) >= len(t.decoded) || t.decoded[id] == nil {
			return nil, fmt.Errorf("%w: id %d at position %d is not in the vocabulary of %d", ErrUnknownToken, id, i, t.vocabSize)
		}
		out = append(out, t.decoded[id]...)
	}
	if t.stripSpace && len(ids) > 0 && !t.added.isAdded(ids[0]) && len(out) > 0 && out[0] == ' ' {
		out = out[1:]
	}
	return out, nil
}

// quote quotes s for an error message.
func quote(s string) string { return strconv.Quote(s) }
