package tokenizer

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the tokenizer.json decoder with the
// production limits: it must return a tokenizer or one of the package's
// errors, never panic, and a tokenizer it returns must encode text without
// panicking and only to ids inside its vocabulary.
func FuzzParse(f *testing.F) {
	for _, path := range []string{"testdata/tiny-bytelevel.json", "testdata/tiny-sentencepiece.json"} {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]},"pre_tokenizer":{"type":"Metaspace","replacement":"a","split":true}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":5,"content":"a","lstrip":true,"rstrip":true,"single_word":true}],"post_processor":{"type":"TemplateProcessing","single":[{"Sequence":{"id":"A"}},{"SpecialToken":{"id":"x"}}],"special_tokens":{"x":{"id":"x","ids":[5]}}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error outside the package's kinds: %v", err)
			}
			return
		}
		for _, text := range []string{"", "ab a", " a  b\n", "é😀\xff", "aaaa bbbb"} {
			ids, err := tok.Encode(nil, text, true)
			if err != nil {
				if !errors.Is(err, ErrUnknownToken) {
					t.Fatalf("Encode(%q): %v", text, err)
				}
				continue
			}
			for _, id := range ids {
				if int(id) >= tok.VocabSize() {
					t.Fatalf("Encode(%q) gave id %d, vocabulary %d", text, id, tok.VocabSize())
				}
			}
		}
	})
}

// FuzzEncode checks that the byte-level tokenizer round-trips any bytes and
// the SentencePiece one any valid UTF-8 text without added tokens.
func FuzzEncode(f *testing.F) {
	bl := mustLoad(f, "testdata/tiny-bytelevel.json")
	sp := mustLoad(f, "testdata/tiny-sentencepiece.json")
	for _, s := range []string{"the thing", " ab a", "é😀", "\xff\x00", "  \n\t x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := bl.Encode(nil, s, false)
		if err != nil {
			t.Fatal(err)
		}
		back, err := bl.Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains([]byte(s), []byte("<|endoftext|>")) && string(back) != s {
			t.Fatalf("byte-level: Decode(Encode(%q)) = %q", s, back)
		}
		ids, err = sp.Encode(nil, s, false)
		if err != nil {
			t.Fatal(err)
		}
		back, err = sp.Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		if s != "" && !bytes.Contains([]byte(s), []byte("<")) && !bytes.Contains([]byte(s), []byte("▁")) && string(back) != s {
			t.Fatalf("sentencepiece: Decode(Encode(%q)) = %q", s, back)
		}
	})
}
