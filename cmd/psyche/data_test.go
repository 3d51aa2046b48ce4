package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/trainer/data"
)

func TestDataTokenizeWritesTokenFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "opticks.txt")
	text := data.Opticks()[:5000]
	if err := os.WriteFile(in, text, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args      []string
		tokenSize int
	}{
		{nil, 2}, // the default
		{[]string{"--token-size", "2"}, 2},
		{[]string{"--token-size", "4"}, 4},
	} {
		t.Run(fmt.Sprint(tc.args), func(t *testing.T) {
			out := filepath.Join(dir, fmt.Sprintf("tokens-%d.bin", len(tc.args)+tc.tokenSize))
			var stdout, stderr bytes.Buffer
			args := append([]string{"psyche", "data", "tokenize", "--in", in, "--out", out}, tc.args...)
			if code := run(args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			info, err := os.Stat(out)
			if err != nil {
				t.Fatal(err)
			}
			if info.Size() != int64(len(text)*tc.tokenSize) {
				t.Errorf("file has %d bytes, want %d", info.Size(), len(text)*tc.tokenSize)
			}
			tokens, err := data.ReadTokenFile(context.Background(), out, tc.tokenSize)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tokens, data.Tokenize(text)) {
				t.Error("the file does not hold the text's tokens")
			}
			summary := stdout.String()
			for _, want := range []string{"5000 tokens", fmt.Sprintf("%d bytes", len(text)*tc.tokenSize), out} {
				if !strings.Contains(summary, want) {
					t.Errorf("summary %q lacks %q", summary, want)
				}
			}
		})
	}
}

// --in builtin:opticks is the built-in corpus, the text trainers train on
// for data = "builtin:opticks".
func TestDataTokenizeBuiltin(t *testing.T) {
	out := filepath.Join(t.TempDir(), "opticks.tokens")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"psyche", "data", "tokenize", "--in", "builtin:opticks", "--out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	tokens, err := data.ReadTokenFile(context.Background(), out, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tokens, data.Tokenize(data.Opticks())) {
		t.Error("the file does not hold the built-in corpus's tokens")
	}
	stderr.Reset()
	if code := run([]string{"psyche", "data", "tokenize", "--in", "builtin:principia", "--out", out}, &stdout, &stderr); code == 0 ||
		!strings.Contains(stderr.String(), `unknown built-in corpus "builtin:principia": the built-in ones are builtin:opticks`) {
		t.Errorf("an unknown corpus: exit %d: %s", code, stderr.String())
	}
}

func TestDataTokenizeErrors(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.bin")
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"missing input", []string{"--in", filepath.Join(dir, "nope.txt"), "--out", out}, "no such file"},
		{"bad token size", []string{"--in", in, "--out", out, "--token-size", "3"}, "--token-size must be 2 or 4"},
		{"no --in", []string{"--out", out}, `"in"`},
		{"output directory missing", []string{"--in", in, "--out", filepath.Join(dir, "no", "out.bin")}, "data: write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(append([]string{"psyche", "data", "tokenize"}, tc.args...), &stdout, &stderr); code == 0 {
				t.Fatal("exit 0")
			}
			if !strings.Contains(stderr.String(), tc.msg) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.msg)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("output written despite the error (%v)", err)
			}
		})
	}
}

// bigVocabTokenizer writes a copy of the tiny byte-level tokenizer.json
// with an added token of id 70000, so its vocabulary needs 4-byte tokens.
func bigVocabTokenizer(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile("../../trainer/tokenizer/testdata/tiny-bytelevel.json")
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte(`"id": 300`), []byte(`"id": 70000`), 1)
	path := filepath.Join(dir, "big.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDataTokenizeWithTokenizer(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("ab a<|endoftext|>the thing"), 0o644); err != nil {
		t.Fatal(err)
	}
	tiny := "../../trainer/tokenizer/testdata/tiny-sentencepiece.json"
	for _, tc := range []struct {
		name      string
		args      []string
		tokenSize int
		want      []uint32
		summary   string
	}{
		// <s>, ▁ab, ▁a, then "<|endoftext|>the▁thing" is not in the tiny
		// vocabulary: bytes, with ▁ (259) before "thing".
		{"sentencepiece, u16 by default", []string{"--tokenizer", tiny}, 2, nil, "vocabulary 265: model.vocab_size = 265, model.token_size = 2"},
		{"no special tokens", []string{"--tokenizer", tiny, "--add-special-tokens=false"}, 2, nil, "model.token_size = 2"},
		{"vocabulary over 65536 gets u32", []string{"--tokenizer", bigVocabTokenizer(t, dir)}, 4,
			[]uint32{'a', 'b', ' ', 'a', 70000, 't', 257, 256, 'h', 260}, "vocabulary 70001: model.vocab_size = 70001, model.token_size = 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out.bin")
			var stdout, stderr bytes.Buffer
			args := append([]string{"psyche", "data", "tokenize", "--in", in, "--out", out}, tc.args...)
			if code := run(args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.summary) {
				t.Errorf("summary %q lacks %q", stdout.String(), tc.summary)
			}
			tokens, err := data.ReadTokenFile(context.Background(), out, tc.tokenSize)
			if err != nil {
				t.Fatal(err)
			}
			special := slices.Contains(tc.args, "--add-special-tokens=false")
			if tc.want == nil {
				tc.want = []uint32{1, 264, 262}
				if special {
					tc.want = tc.want[1:]
				}
				for _, c := range []byte("<|endoftext|>the") {
					tc.want = append(tc.want, 3+uint32(c))
				}
				tc.want = append(tc.want, 259)
				for _, c := range []byte("thing") {
					tc.want = append(tc.want, 3+uint32(c))
				}
			}
			if !slices.Equal(tokens, tc.want) {
				t.Errorf("tokens %v, want %v", tokens, tc.want)
			}
		})
	}
}

func TestDataTokenizeTokenizerErrors(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	wordPiece := filepath.Join(dir, "wordpiece.json")
	if err := os.WriteFile(wordPiece, []byte(`{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.bin")
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"unsupported model", []string{"--tokenizer", wordPiece}, wordPiece + `: unsupported: model.type: "WordPiece" is not supported`},
		{"u16 too small", []string{"--tokenizer", bigVocabTokenizer(t, dir), "--token-size", "2"}, "vocabulary 70001 > 65536"},
		{"missing tokenizer", []string{"--tokenizer", filepath.Join(dir, "nope.json")}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"psyche", "data", "tokenize", "--in", in, "--out", out}, tc.args...)
			if code := run(args, &stdout, &stderr); code == 0 {
				t.Fatal("exit 0")
			}
			if !strings.Contains(stderr.String(), tc.msg) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.msg)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("output written despite the error (%v)", err)
			}
		})
	}
}
