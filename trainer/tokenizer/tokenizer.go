package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

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

// Load reads and parses the tokenizer.json at path. Errors name the file.
func Load(path string) (*Tokenizer, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if info.Size() > MaxFileBytes {
		return nil, fmt.Errorf("%w: %s has %d bytes, the limit is %d", ErrTooLarge, path, info.Size(), MaxFileBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := Parse(b)
	if err != nil {
		return nil, &fileError{path: filepath.Clean(path), err: err}
	}
	return t, nil
}

// fileError puts the file name into an error from Parse.
type fileError struct {
	path string
	err  error
}

func (e *fileError) Error() string {
	return "tokenizer: " + e.path + ": " + strings.TrimPrefix(e.err.Error(), "tokenizer: ")
}

func (e *fileError) Unwrap() error { return e.err }

// fieldError names the JSON field at fault.
func fieldError(sentinel error, field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", sentinel, field, fmt.Sprintf(format, args...))
}

// Parse parses the bytes of a tokenizer.json.
func Parse(b []byte) (*Tokenizer, error) {
	f, err := decodeFile(b)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{}
	if f.Normalizer != nil {
		if t.normalize, err = parseNormalizer(*f.Normalizer, "normalizer", 0); err != nil {
			return nil, err
		}
		if g := replaceGrowth(t.normalize); g > MaxNormalizerGrowth {
			return nil, fieldError(ErrTooLarge, "normalizer", "its Replace steps can make a text %.3g times longer, the limit is %d", g, MaxNormalizerGrowth)
		}
	}
	if f.PreTokenizer != nil {
		if t.pre, err = parsePreTokenizer(*f.PreTokenizer, "pre_tokenizer", 0); err != nil {
			return nil, err
		}
	}
	byteLevel := slices.ContainsFunc(t.pre, func(p preStep) bool { return p.kind == kindByteLevel })
	if t.model, err = parseModel(f.Model, byteLevel); err != nil {
		return nil, err
	}
	if err := t.buildVocab(f); err != nil {
		return nil, err
	}
	if f.PostProcessor != nil {
		if err := t.parseProcessor(*f.PostProcessor, "post_processor", 0); err != nil {
			return nil, err
		}
	}
	for _, n := range t.normalize {
		if n.isPrependOne && n.prepend == "▁" {
			t.stripSpace = true
		}
	}
	for _, p := range t.pre {
		if p.kind == kindMetaspace && p.prependScheme != "never" && p.replacement == "▁" {
			t.stripSpace = true
		}
	}
	return t, nil
}

// replaceGrowth is how many times longer the Replace steps among steps can
// make a text, at most: each replaces a pattern of len(from) bytes by
// len(to), so it multiplies a length by at most len(to)/len(from).
func replaceGrowth(steps []normStep) float64 {
	g := 1.0
	for _, s := range steps {
		if s.isReplace && len(s.to) > len(s.from) {
			g *= float64(len(s.to)) / float64(len(s.from))
		}
	}
	return g
}

func parseNormalizer(n normalizerJSON, field string, depth int) ([]normStep, error) {
	if depth > MaxNesting {
		return nil, fieldError(ErrTooLarge, field, "nested deeper than %d", MaxNesting)
	}
	switch n.Type {
	case "Sequence":
		var steps []normStep
		for i, sub := range n.Normalizers {
			s, err := parseNormalizer(sub, fmt.Sprintf("%s.normalizers[%d]", field, i), depth+1)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s...)
		}
		return steps, nil
	case "Prepend":
		return []normStep{{prepend: n.Prepend, isPrependOne: true}}, nil
	case "Replace":
		if n.Pattern.String == nil {
			return nil, fieldError(ErrUnsupported, field+".pattern", "only a String pattern is supported")
		}
		if *n.Pattern.String == "" {
			return nil, fieldError(ErrMalformed, field+".pattern", "empty String pattern")
		}
		return []normStep{{from: *n.Pattern.String, to: n.Content, isReplace: true}}, nil
	}
	if form, ok := unicodeForms[n.Type]; ok {
		return []normStep{{form: &form}}, nil
	}
	return nil, fieldError(ErrUnsupported, field+".type", "normalizer %q is not supported (Sequence, Prepend, Replace, NFC, NFD, NFKC and NFKD are)", n.Type)
}

func parsePreTokenizer(p preTokenizerJSON, field string, depth int) ([]preStep, error) {
	if depth > MaxNesting {
		return nil, fieldError(ErrTooLarge, field, "nested deeper than %d", MaxNesting)
	}
	switch p.Type {
	case "Sequence":
		var steps []preStep
		for i, sub := range p.PreTokenizers {
			s, err := parsePreTokenizer(sub, fmt.Sprintf("%s.pretokenizers[%d]", field, i), depth+1)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s...)
		}
		return steps, nil
	case "ByteLevel":
		s := preStep{kind: kindByteLevel, addPrefixSpace: p.AddPrefixSpace != nil && *p.AddPrefixSpace}
		if p.UseRegex == nil || *p.UseRegex {
			s.split = splitGPT2
		}
		return []preStep{s}, nil
	case "Split":
		if p.Pattern.Regex == nil {
			return nil, fieldError(ErrUnsupported, field+".pattern", "only a Regex pattern is supported")
		}
		split, ok := splitters[*p.Pattern.Regex]
		if !ok {
			return nil, fieldError(ErrUnsupported, field+".pattern.Regex",
				"regex %s is not one of those implemented (GPT-2's and Llama 3's)", truncate(strconv.Quote(*p.Pattern.Regex)))
		}
		// The regexes match every character, so the pieces are the
		// matches whether they are kept (Isolated) or what is left when
		// the (empty) gaps between them are removed (Removed, inverted).
		if p.Behavior != "Isolated" && (p.Behavior != "Removed" || !p.Invert) {
			return nil, fieldError(ErrUnsupported, field+".behavior", "only Isolated, or Removed with invert, is supported, got %q (invert %v)", p.Behavior, p.Invert)
		}
		return []preStep{{kind: kindSplit, split: split}}, nil
	case "Metaspace":
		s := preStep{kind: kindMetaspace, replacement: p.Replacement, prependScheme: p.PrependScheme, splitPieces: p.Split == nil || *p.Split}
		if utf8.RuneCountInString(s.replacement) != 1 {
			return nil, fieldError(ErrMalformed, field+".replacement", "must be one character, got %q", s.replacement)
		}
		if s.prependScheme == "" {
			s.prependScheme = "always"
			if p.AddPrefixSpace != nil && !*p.AddPrefixSpace {
				s.prependScheme = "never"
			}
		}
		switch s.prependScheme {
		case "always", "first", "never":
		default:
			return nil, fieldError(ErrUnsupported, field+".prepend_scheme", "%q is not always, first or never", s.prependScheme)
		}
		return []preStep{s}, nil
	}
	return nil, fieldError(ErrUnsupported, field+".type", "pre-tokenizer %q is not supported (Sequence, ByteLevel, Split and Metaspace are)", p.Type)
}

func parseModel(m *modelJSON, byteLevel bool) (*bpe, error) {
	if m.Type != "BPE" && !(m.Type == "" && m.Merges != nil) {
		return nil, fieldError(ErrUnsupported, "model.type", "%q is not supported: only BPE models are (byte-level as in GPT-2 and Llama 3, or SentencePiece-style with byte fallback as in Llama 2)", m.Type)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return nil, fieldError(ErrUnsupported, "model.continuing_subword_prefix", "%q is not supported", *m.ContinuingSubwordPrefix)
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return nil, fieldError(ErrUnsupported, "model.end_of_word_suffix", "%q is not supported", *m.EndOfWordSuffix)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fieldError(ErrUnsupported, "model.dropout", "%v: dropout makes tokenization random", *m.Dropout)
	}
	var vocab map[string]int64
	if err := json.Unmarshal(m.Vocab, &vocab); err != nil {
		return nil, fieldError(ErrMalformed, "model.vocab", "not an object of token ids: %v", err)
	}
	if len(vocab) == 0 {
		return nil, fieldError(ErrMalformed, "model.vocab", "empty or missing")
	}
	if len(vocab) > MaxVocabSize {
		return nil, fieldError(ErrTooLarge, "model.vocab", "%d tokens, the limit is %d", len(vocab), MaxVocabSize)
	}
	if len(m.Merges) > MaxMerges {
		return nil, fieldError(ErrTooLarge, "model.merges", "%d merges, the limit is %d", len(m.Merges), MaxMerges)
	}
	b := &bpe{
		vocab:        make(map[string]uint32, len(vocab)),
		merges:       make(map[uint64]merge, len(m.Merges)),
		byteLevel:    byteLevel,
		ignoreMerges: m.IgnoreMerges,
		byteFallback: m.ByteFallback,
		fuseUnk:      m.FuseUnk,
		unk:          -1,
		cache:        map[string][]uint32{},
	}
	// key converts a vocabulary string to the model's form.
	key := func(tok, field string) (string, error) {
		if len(tok) > MaxTokenBytes {
			return "", fieldError(ErrTooLarge, field, "token of %d bytes, the limit is %d", len(tok), MaxTokenBytes)
		}
		if !byteLevel {
			return tok, nil
		}
		raw, ok := fromByteLevel(tok)
		if !ok {
			return "", fieldError(ErrMalformed, field, "%s is not in the byte-level alphabet of a ByteLevel pre-tokenizer", truncate(strconv.Quote(tok)))
		}
		return string(raw), nil
	}
	for tok, id := range vocab {
		if id < 0 || id >= MaxVocabSize {
			return nil, fieldError(ErrMalformed, "model.vocab", "token %s has id %d, outside [0, %d)", truncate(strconv.Quote(tok)), id, MaxVocabSize)
		}
		k, err := key(tok, "model.vocab")
		if err != nil {
			return nil, err
		}
		b.vocab[k] = uint32(id)
	}
	for i, raw := range m.Merges {
		field := func() string { return fmt.Sprintf("model.merges[%d]", i) }
		l, r, err := decodeMerge(raw)
		if err != nil {
			return nil, fieldError(ErrMalformed, field(), "%v", err)
		}
		// Merges name tokens as the vocabulary writes them, so they are
		// looked up there, before any byte-level conversion.
		var ids [3]uint32
		for j, tok := range [3]string{l, r, l + r} {
			id, ok := vocab[tok]
			if !ok {
				return nil, fieldError(ErrMalformed, field(), "%s is not in model.vocab", truncate(strconv.Quote(tok)))
			}
			ids[j] = uint32(id)
		}
		if _, dup := b.merges[pairKey(ids[0], ids[1])]; !dup { // the first rank wins
			b.merges[pairKey(ids[0], ids[1])] = merge{rank: uint32(i), result: ids[2]}
		}
	}
	if !byteLevel {
		b.splitAtMeta = true
		for tok := range b.vocab {
			if strings.Contains(strings.TrimLeft(tok, meta), meta) {
				b.splitAtMeta = false
				break
			}
		}
	}
	for i := range b.byteIDs {
		b.byteIDs[i] = -1
		if id, ok := b.vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			b.byteIDs[i] = int64(id)
		}
	}
	if m.ByteFallback && b.byteIDs[0] < 0 {
		// A model with byte fallback but no byte tokens falls back to unk.
		b.byteFallback = false
	}
	if m.UnkToken != nil {
		k, err := key(*m.UnkToken, "model.unk_token")
		if err != nil {
			return nil, err
		}
		id, ok := b.vocab[k]
		if !ok {
			return nil, fieldError(ErrMalformed, "model.unk_token", "%q is not in model.vocab", *m.UnkToken)
		}
		b.unk = int64(id)
	}
	return b, nil
}

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

// quote quotes s for an error message.
func quote(s string) string { return strconv.Quote(s) }
