package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func mustLoad(t testing.TB, path string) *Tokenizer {
	t.Helper()
	tok, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// The tiny tokenizers in testdata have vocabularies small enough to work
// the expected ids out by hand (see the comments).
func TestEncodeTiny(t *testing.T) {
	bl := mustLoad(t, "testdata/tiny-bytelevel.json")
	sp := mustLoad(t, "testdata/tiny-sentencepiece.json")
	tests := []struct {
		name    string
		tok     *Tokenizer
		text    string
		special bool
		want    []uint32
	}{
		// Bytes are ids 0-255; merges 256 Ġt, 257 he, 258 Ġthe, 259 in, 260 ing.
		// "the" is t+he (no "t he" merge); " thing" is Ġt h ing.
		{"byte-level words", bl, "the thing", false, []uint32{'t', 257, 256, 'h', 260}},
		{"byte-level merges by rank", bl, " the", false, []uint32{258}},
		{"byte-level added token", bl, "in<|endoftext|>in", false, []uint32{259, 300, 259}},
		{"byte-level multibyte", bl, "é", false, []uint32{0xC3, 0xA9}},
		{"byte-level invalid UTF-8", bl, "\xff\xfe", false, []uint32{0xFF, 0xFE}},
		{"byte-level no template", bl, "in", true, []uint32{259}},
		{"byte-level empty", bl, "", true, nil},
		// 0 <unk>, 1 <s>, 2 </s>, 3+b <0xbb>, 259 ▁, 260 a, 261 b, 262 ▁a, 263 ab, 264 ▁ab.
		// "ab a" → "▁ab▁a": ▁a (rank 0) twice, then ▁a+b (rank 2).
		{"sentencepiece merges", sp, "ab a", false, []uint32{264, 262}},
		{"sentencepiece template", sp, "ab a", true, []uint32{1, 264, 262}},
		{"sentencepiece byte fallback", sp, "é", false, []uint32{259, 3 + 0xC3, 3 + 0xA9}},
		{"sentencepiece unknown ascii", sp, "c", false, []uint32{259, 3 + 'c'}},
		{"sentencepiece added tokens prepend per section", sp, "a</s>a", false, []uint32{262, 2, 262}},
		{"sentencepiece empty", sp, "", true, []uint32{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.tok.Encode(nil, tc.text, tc.special)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
}

// editJSON loads a testdata tokenizer.json, lets edit change it and parses
// the result.
func editJSON(t testing.TB, path string, edit func(map[string]any)) (*Tokenizer, error) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	return Parse(b)
}

func TestUnknownWithoutByteFallback(t *testing.T) {
	for _, tc := range []struct {
		fuse bool
		want []uint32
	}{{true, []uint32{259, 0}}, {false, []uint32{259, 0, 0}}} {
		tok, err := editJSON(t, "testdata/tiny-sentencepiece.json", func(m map[string]any) {
			model := m["model"].(map[string]any)
			model["byte_fallback"] = false
			model["fuse_unk"] = tc.fuse
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := tok.Encode(nil, "cc", false)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("fuse_unk %v: Encode(cc) = %v, %v; want %v", tc.fuse, got, err, tc.want)
		}
	}
	tok, err := editJSON(t, "testdata/tiny-sentencepiece.json", func(m map[string]any) {
		model := m["model"].(map[string]any)
		model["byte_fallback"] = false
		model["unk_token"] = nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.Encode(nil, "c", false); !errors.Is(err, ErrUnknownToken) {
		t.Errorf("no unk and no byte fallback: got %v, want ErrUnknownToken", err)
	}
}

// Merges written as ["a", "b"] (tokenizers ≥ 0.20) and as "a b" give the
// same tokenizer: the real Llama 3 file converted to the array form encodes
// the multilingual text to the same ids.
func TestMergeFormats(t *testing.T) {
	path := needReference(t, "llama3")
	strForm := mustLoad(t, path)
	arrForm, err := editJSON(t, path, func(m map[string]any) {
		model := m["model"].(map[string]any)
		merges := model["merges"].([]any)
		for i, s := range merges {
			a, b, _ := strings.Cut(s.(string), " ")
			merges[i] = []string{a, b}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile("testdata/multilingual.txt")
	if err != nil {
		t.Fatal(err)
	}
	a, err1 := strForm.Encode(nil, string(text), true)
	b, err2 := arrForm.Encode(nil, string(text), true)
	if err1 != nil || err2 != nil || !slices.Equal(a, b) || len(a) == 0 {
		t.Fatalf("string merges: %d ids (%v), array merges: %d ids (%v)", len(a), err1, len(b), err2)
	}
}

// Decode inverts Encode on text without added tokens.
func TestRoundTrip(t *testing.T) {
	text, err := os.ReadFile("testdata/multilingual.txt")
	if err != nil {
		t.Fatal(err)
	}
	plain := strings.NewReplacer("<s>", "", "</s>", "", "<unk>", "", "<|endoftext|>", "").Replace(string(text))
	for _, path := range []string{"testdata/tiny-bytelevel.json", "testdata/tiny-sentencepiece.json"} {
		tok := mustLoad(t, path)
		for _, s := range append(strings.Split(plain, "\n"), plain, " leading", "  two", "") {
			ids, err := tok.Encode(nil, s, false)
			if err != nil {
				t.Fatal(err)
			}
			back, err := tok.Decode(ids)
			if err != nil || string(back) != s {
				t.Fatalf("%s: Decode(Encode(%q)) = %q, %v", path, s, back, err)
			}
		}
	}
	if _, err := mustLoad(t, "testdata/tiny-bytelevel.json").Decode([]uint32{301}); !errors.Is(err, ErrUnknownToken) {
		t.Errorf("Decode of an id outside the vocabulary: %v", err)
	}
}

func TestVocabSizeAndID(t *testing.T) {
	bl := mustLoad(t, "testdata/tiny-bytelevel.json")
	if bl.VocabSize() != 301 {
		t.Errorf("VocabSize = %d, want 301", bl.VocabSize())
	}
	for tok, want := range map[string]uint32{"Ġthe": 258, "<|endoftext|>": 300, "Ġ": ' '} {
		if id, ok := bl.ID(tok); !ok || id != want {
			t.Errorf("ID(%q) = %d, %v; want %d", tok, id, ok, want)
		}
	}
	if _, ok := bl.ID("nope"); ok {
		t.Error("ID of a missing token")
	}
}

// Bad tokenizer.json files fail with the sentinel and name the field.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(m map[string]any)
		want  error
		field string
	}{
		{"WordPiece model", func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" }, ErrUnsupported, "model.type"},
		{"Unigram model", func(m map[string]any) { m["model"] = map[string]any{"type": "Unigram", "vocab": []any{}} }, ErrUnsupported, "model.type"},
		{"unknown regex", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\w+`}, "behavior": "Isolated"}
		}, ErrUnsupported, "pre_tokenizer.pattern.Regex"},
		{"split behaviour", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": PatternLlama3}, "behavior": "Removed"}}}
		}, ErrUnsupported, "pre_tokenizer.pretokenizers[0].behavior"},
		{"unknown pre-tokenizer", func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "BertPreTokenizer"} }, ErrUnsupported, "pre_tokenizer.type"},
		{"BERT normalizer", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "BertNormalizer"} }, ErrUnsupported, "normalizer.type"},
		{"Bert post-processor", func(m map[string]any) { m["post_processor"] = map[string]any{"type": "BertProcessing"} }, ErrUnsupported, "post_processor.type"},
		{"dropout", func(m map[string]any) { m["model"].(map[string]any)["dropout"] = 0.1 }, ErrUnsupported, "model.dropout"},
		{"merge of a missing token", func(m map[string]any) {
			m["model"].(map[string]any)["merges"] = []any{[]any{"Ġ", "zz"}}
		}, ErrMalformed, "model.merges[0]"},
		{"merge of three tokens", func(m map[string]any) { m["model"].(map[string]any)["merges"] = []any{"a b c"} }, ErrMalformed, "model.merges[0]"},
		{"merge not a pair", func(m map[string]any) { m["model"].(map[string]any)["merges"] = []any{[]any{"a"}} }, ErrMalformed, "model.merges[0]"},
		{"negative id", func(m map[string]any) { m["model"].(map[string]any)["vocab"].(map[string]any)["x"] = -1 }, ErrMalformed, "model.vocab"},
		{"shared id", func(m map[string]any) { m["model"].(map[string]any)["vocab"].(map[string]any)["x"] = 3 }, ErrMalformed, "model.vocab"},
		{"not byte-level", func(m map[string]any) { m["model"].(map[string]any)["vocab"].(map[string]any)["a b"] = 999 }, ErrMalformed, "model.vocab"},
		{"empty vocab", func(m map[string]any) { m["model"].(map[string]any)["vocab"] = map[string]any{} }, ErrMalformed, "model.vocab"},
		{"added token without id", func(m map[string]any) { m["added_tokens"] = []any{map[string]any{"content": "x"}} }, ErrMalformed, "added_tokens[0].id"},
		{"long token", func(m map[string]any) {
			m["model"].(map[string]any)["vocab"].(map[string]any)[strings.Repeat("a", MaxTokenBytes+1)] = 999
		}, ErrTooLarge, "model.vocab"},
		{"deep nesting", func(m map[string]any) {
			var n any = map[string]any{"type": "Prepend", "prepend": "x"}
			for range MaxNesting + 2 {
				n = map[string]any{"type": "Sequence", "normalizers": []any{n}}
			}
			m["normalizer"] = n
		}, ErrTooLarge, "normalizer"},
		{"no model", func(m map[string]any) { delete(m, "model") }, ErrMalformed, "model"},
		// Four Replaces of "e" by 1,000 "e" (an 8 KB file) would make one
		// "e" a terabyte long: refused from the steps themselves.
		{"Replace that grows a text", func(m map[string]any) {
			var steps []any
			for range 4 {
				steps = append(steps, map[string]any{"type": "Replace", "pattern": map[string]any{"String": "e"}, "content": strings.Repeat("e", 1000)})
			}
			m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": steps}
		}, ErrTooLarge, "normalizer"},
		// More merges or tokens than the limits are refused as the
		// count passes the limit, before the file is decoded (a 250 MiB
		// list of merges held more than 3.5 GB before).
		{"too many merges", func(m map[string]any) {
			merges := make([]any, MaxMerges+1)
			for i := range merges {
				merges[i] = "Ġ t"
			}
			m["model"].(map[string]any)["merges"] = merges
		}, ErrTooLarge, "model.merges"},
		{"too many tokens", func(m map[string]any) {
			vocab := make(map[string]any, MaxVocabSize+1)
			for i := range MaxVocabSize + 1 {
				vocab[strconv.Itoa(i)] = i
			}
			m["model"].(map[string]any)["vocab"] = vocab
		}, ErrTooLarge, "model.vocab"},
		{"too many added tokens", func(m map[string]any) {
			added := make([]any, MaxAddedTokens+1)
			for i := range added {
				added[i] = map[string]any{"id": 0, "content": "x"}
			}
			m["added_tokens"] = added
		}, ErrTooLarge, "added_tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := editJSON(t, "testdata/tiny-bytelevel.json", tc.edit)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want %v naming %s", err, tc.want, tc.field)
			}
		})
	}
	if _, err := Parse([]byte(`{"model": {"type": "BPE"}} {}`)); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing data: %v", err)
	}
	if _, err := Parse(make([]byte, MaxFileBytes+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized file: %v", err)
	}
}

// Load's errors name the file.
func TestLoadNamesTheFile(t *testing.T) {
	path := t.TempDir() + "/tokenizer.json"
	if err := os.WriteFile(path, []byte(`{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `model.type: "WordPiece"`) {
		t.Fatalf("got %v", err)
	}
}

func ExampleTokenizer_Encode() {
	tok, err := Load("testdata/tiny-sentencepiece.json")
	if err != nil {
		panic(err)
	}
	ids, err := tok.Encode(nil, "ab a é", true)
	if err != nil {
		panic(err)
	}
	text, _ := tok.Decode(ids[1:])
	fmt.Println(ids, string(text), utf8.ValidString(string(text)))
	// Output: [1 264 262 259 198 172] ab a é true
}

// A Metaspace pre-tokenizer (newer Llama 2 and Mistral files) instead of
// the Prepend and Replace normalizers: prepend_scheme "first" prepends "▁"
// only before the text's first section, "always" before every one.
func TestMetaspace(t *testing.T) {
	for _, tc := range []struct {
		scheme string
		split  bool
		text   string
		want   []uint32
	}{
		{"first", false, "ab a", []uint32{264, 262}},
		{"first", true, "ab a", []uint32{264, 262}},
		{"first", false, "a</s>a", []uint32{262, 2, 260}},
		{"always", true, "a</s>a", []uint32{262, 2, 262}},
		{"never", false, "a a", []uint32{260, 262}},
		// split cuts before every ▁: "a▁▁a" is "a", "▁", "▁a".
		{"never", true, "a  a", []uint32{260, 259, 262}},
	} {
		tok, err := editJSON(t, "testdata/tiny-sentencepiece.json", func(m map[string]any) {
			m["normalizer"] = nil
			m["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": tc.scheme, "split": tc.split}
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := tok.Encode(nil, tc.text, false)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s, split %v: Encode(%q) = %v, %v; want %v", tc.scheme, tc.split, tc.text, got, err, tc.want)
		}
		if tc.scheme != "never" && !strings.Contains(tc.text, "<") {
			back, err := tok.Decode(got)
			if err != nil || string(back) != tc.text {
				t.Errorf("%s: Decode = %q, %v", tc.scheme, back, err)
			}
		}
	}
}

// Merging a SentencePiece text piece by piece (splitAtMeta) gives the ids of
// merging it as one word, on the real Llama 2 file and the whole corpus.
func TestSplitAtMetaIsExact(t *testing.T) {
	path := needReference(t, "llama2")
	corpus, err := os.ReadFile("../data/corpus/opticks.txt")
	if err != nil {
		t.Fatal(err)
	}
	pieces, whole := mustLoad(t, path), mustLoad(t, path)
	if !pieces.model.splitAtMeta {
		t.Fatal("the Llama 2 vocabulary should allow splitting at ▁")
	}
	whole.model.splitAtMeta = false
	a, err1 := pieces.Encode(nil, string(corpus), true)
	b, err2 := whole.Encode(nil, string(corpus), true)
	if err1 != nil || err2 != nil || len(a) < 100000 {
		t.Fatal(err1, err2, len(a))
	}
	if k := firstDifference(a, b); k >= 0 {
		t.Fatalf("piece by piece and whole differ at id %d: %v, %v", k, window(a, k), window(b, k))
	}
	// A vocabulary with a token that holds ▁ after another character
	// keeps the text whole.
	tok, err := editJSON(t, "testdata/tiny-sentencepiece.json", func(m map[string]any) {
		m["model"].(map[string]any)["vocab"].(map[string]any)["a▁"] = 300
	})
	if err != nil || tok.model.splitAtMeta {
		t.Fatalf("a▁ in the vocabulary: %v, splitAtMeta %v", err, tok.model.splitAtMeta)
	}
}

// Added tokens' lstrip, rstrip and single_word, with Hugging Face's
// meaning: strip the white space on that side into the token; match only
// between white space (or the text's ends).
func TestAddedTokenOptions(t *testing.T) {
	byteIDs := func(s string) []uint32 {
		var ids []uint32
		for _, b := range []byte(s) {
			ids = append(ids, uint32(b))
		}
		return ids
	}
	tests := []struct {
		option string
		text   string
		want   []uint32
	}{
		{"rstrip", "a<|endoftext|>  b", []uint32{'a', 300, 'b'}},
		{"lstrip", "a  <|endoftext|>b", []uint32{'a', 300, 'b'}},
		{"single_word", "a<|endoftext|>b", byteIDs("a<|endoftext|>b")}, // no merge applies to these bytes
		{"single_word", "a <|endoftext|> b", []uint32{'a', ' ', 300, ' ', 'b'}},
		{"", "a <|endoftext|> b", []uint32{'a', ' ', 300, ' ', 'b'}},
	}
	for _, tc := range tests {
		tok, err := editJSON(t, "testdata/tiny-bytelevel.json", func(m map[string]any) {
			if tc.option != "" {
				m["added_tokens"].([]any)[0].(map[string]any)[tc.option] = true
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := tok.Encode(nil, tc.text, false)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: Encode(%q) = %v, %v; want %v", tc.option, tc.text, got, err, tc.want)
		}
	}
}

// precheck, the walk before the decode, is what refuses an oversized list:
// the decode itself would hold every entry first. It accepts the real files.
func TestPrecheckRefusesBeforeDecoding(t *testing.T) {
	b, err := os.ReadFile("testdata/tiny-bytelevel.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := precheck(b); err != nil {
		t.Fatalf("a valid file: %v", err)
	}
	merges := strings.Repeat(`"Ġ t",`, MaxMerges) + `"Ġ t"`
	for _, tc := range []struct{ name, json, field string }{
		{"merges", `{"model": {"type": "BPE", "vocab": {}, "merges": [` + merges + `]}}`, "model.merges"},
		{"merges as pairs", `{"model": {"merges": [` + strings.Repeat(`["a","b"],`, MaxMerges) + `["a","b"]]}}`, "model.merges"},
		{"added tokens", `{"added_tokens": [` + strings.Repeat(`{},`, MaxAddedTokens) + `{}], "model": {}}`, "added_tokens"},
		{"nesting", strings.Repeat("[", maxJSONDepth+1), "nested deeper"},
	} {
		if err := precheck([]byte(tc.json)); !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrMalformed) || err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: precheck = %v, want a refusal naming %s", tc.name, err, tc.field)
		}
	}
	// Counted lists elsewhere in the file are not the model's.
	if err := precheck([]byte(`{"other": {"merges": [` + merges + `]}, "model": {}}`)); err != nil {
		t.Errorf("a list outside model: %v", err)
	}
}
