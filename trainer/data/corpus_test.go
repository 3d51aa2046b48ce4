package data

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// A builtin: location is the token file `psyche data tokenize` would write
// from the same text (Tokenize, then WriteTokenFile), at either token size:
// the same sequences at every data index, shuffled or not.
func TestBuiltinOpticksIsItsTokenFile(t *testing.T) {
	ctx := context.Background()
	tokens := Tokenize(Opticks())
	for _, tokenSize := range []int{TokenSize16, TokenSize32} {
		path := writeTemp(t, tokens, tokenSize)
		for _, opts := range [][]Option{nil, {WithShuffleSeed(7), WithVocabSize(ByteVocabSize)}} {
			file := openProvider(t, path, tokenSize, 64, opts...)
			builtin := openProvider(t, "builtin:opticks", tokenSize, 64, opts...)
			if builtin.NumTokens() != uint64(len(tokens)) || builtin.NumSequences() != file.NumSequences() {
				t.Fatalf("token size %d: builtin:opticks holds %d tokens in %d sequences, the file %d in %d", tokenSize,
					builtin.NumTokens(), builtin.NumSequences(), file.NumTokens(), file.NumSequences())
			}
			a, b := make([]uint32, 65), make([]uint32, 65)
			for d := range file.NumSequences() + 3 { // past the end: indices wrap alike
				var err1, err2 error
				a, err1 = file.Sequence(ctx, d, a)
				b, err2 = builtin.Sequence(ctx, d, b)
				if err1 != nil || err2 != nil || !slices.Equal(a, b) {
					t.Fatalf("token size %d, index %d: the builtin sequence differs from the file's (%v, %v)", tokenSize, d, err1, err2)
				}
			}
		}
	}
	src, err := OpenSource(ctx, "builtin:opticks", TokenSize16)
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(src); got != "builtin:opticks" {
		t.Errorf("the source is named %q in errors", got)
	}
}

func TestBuiltinRejects(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		location  string
		tokenSize int
		want      string
	}{
		{"builtin:shakespeare", 2, `unknown built-in corpus "builtin:shakespeare": the built-in ones are builtin:opticks`},
		{"builtin:", 2, `unknown built-in corpus "builtin:"`},
		{"builtin:Opticks", 2, "unknown built-in corpus"},
		{"builtin:opticks", 3, "token size must be 2 or 4 bytes, got 3"},
	} {
		_, err := OpenSource(ctx, tc.location, tc.tokenSize)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s at %d bytes: %v, want %q", tc.location, tc.tokenSize, err, tc.want)
		}
	}
	// Longer sequences than the corpus holds: the file's error.
	if _, err := Open(ctx, "builtin:opticks", 2, 1<<20); !errors.Is(err, ErrTooShort) || !strings.Contains(err.Error(), "builtin:opticks holds") {
		t.Errorf("a sequence longer than the corpus: %v", err)
	}
	if got := Builtins(); !slices.Equal(got, []string{"opticks"}) {
		t.Errorf("Builtins = %v", got)
	}
}
