package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The parts of a Hugging Face tokenizer.json this package reads. Fields it
// does not know are ignored; values it does not support are refused.
type fileJSON struct {
	Version       string            `json:"version"`
	AddedTokens   []addedTokenJSON  `json:"added_tokens"`
	Normalizer    *normalizerJSON   `json:"normalizer"`
	PreTokenizer  *preTokenizerJSON `json:"pre_tokenizer"`
	PostProcessor *processorJSON    `json:"post_processor"`
	Model         *modelJSON        `json:"model"`
}

type addedTokenJSON struct {
	ID         *int64 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type normalizerJSON struct {
	Type        string           `json:"type"`
	Normalizers []normalizerJSON `json:"normalizers"`
	Prepend     string           `json:"prepend"`
	Pattern     patternJSON      `json:"pattern"`
	Content     string           `json:"content"`
}

type preTokenizerJSON struct {
	Type           string             `json:"type"`
	PreTokenizers  []preTokenizerJSON `json:"pretokenizers"`
	AddPrefixSpace *bool              `json:"add_prefix_space"`
	UseRegex       *bool              `json:"use_regex"`
	Pattern        patternJSON        `json:"pattern"`
	Behavior       string             `json:"behavior"`
	Invert         bool               `json:"invert"`
	Replacement    string             `json:"replacement"`
	PrependScheme  string             `json:"prepend_scheme"`
	Split          *bool              `json:"split"`
}

type templatePieceJSON struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type processorJSON struct {
	Type          string                         `json:"type"`
	Processors    []processorJSON                `json:"processors"`
	Single        []templatePieceJSON            `json:"single"`
	SpecialTokens map[string]specialTemplateJSON `json:"special_tokens"`
}

type specialTemplateJSON struct {
	ID  string  `json:"id"`
	IDs []int64 `json:"ids"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Vocab                   json.RawMessage   `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Dropout                 *float64          `json:"dropout"`
}

// decodeFile decodes the JSON of a tokenizer.json, enforcing MaxFileBytes.
func decodeFile(b []byte) (*fileJSON, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(b), MaxFileBytes)
	}
	if err := precheck(b); err != nil {
		return nil, err
	}
	var f fileJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrMalformed)
	}
	if f.Model == nil {
		return nil, fmt.Errorf("%w: no \"model\"", ErrMalformed)
	}
	return &f, nil
}

// decodeMerge reads one merge, either "a b" (tokenizers < 0.20) or
// ["a", "b"].
func decodeMerge(raw json.RawMessage) (string, string, error) {
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' &&
		!bytes.ContainsAny(raw[1:n-1], "\\\"") && utf8.Valid(raw) {
		return cutMerge(string(raw[1 : n-1])) // no escapes: no decoder needed
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return cutMerge(s)
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("%s is neither \"a b\" nor [\"a\", \"b\"]", truncate(string(raw)))
	}
	return pair[0], pair[1], nil
}

// cutMerge splits an "a b" merge at its one space.
func cutMerge(s string) (string, string, error) {
	a, b, ok := strings.Cut(s, " ")
	if !ok || strings.Contains(b, " ") {
		return "", "", fmt.Errorf("%q is not two tokens separated by one space", s)
	}
	return a, b, nil
}

// truncate shortens s for an error message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
