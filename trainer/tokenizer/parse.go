package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
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
