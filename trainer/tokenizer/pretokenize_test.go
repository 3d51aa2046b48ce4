package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

func pieces(split splitter, s string) []string {
	var out []string
	split(s, func(a, b int) { out = append(out, s[a:b]) })
	return out
}

// Each case is what the regex, run by Oniguruma as Hugging Face's tokenizers
// does, splits the text into; "|" separates the pieces.
func TestSplitLlama3(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Hello world", "Hello| world"},
		{"It's I'M we'RE 'll 'Ve", "It|'s| I|'M| we|'RE| '|ll| '|Ve"},
		{"'sup 'x", "'s|up| '|x"},
		{"12345 1234567", "123|45| |123|456|7"},
		{"a1b", "a|1|b"},
		{"hello, world!!", "hello|,| world|!!"},
		{"x ,y", "x| ,|y"},
		{"x  ,y", "x| | ,|y"},
		{"a  b", "a| | b"},
		{"a   b", "a|  | b"},
		{"a \tb", "a| |\tb"},
		{"a\n\nb", "a|\n\n|b"},
		{"a \n b", "a| \n| b"},
		{"a \n  b", "a| \n| | b"},
		{"a.\n\nb", "a|.\n\n|b"},
		{"trailing   ", "trailing|   "},
		{" ", " "},
		{"\n", "\n"},
		{"(x)", "(x|)"},
		{"\"quote\"", "\"quote|\""},
		{"中文 字", "中文| 字"},
		{"e\u0301t\u00e9", "e|\u0301t\u00e9"}, // U+0301 is a mark (Mn), not a letter
		{"a\u00a0b", "a|\u00a0b"},             // NBSP is White_Space
		{"a\u0085b", "a|\u0085b"},             // NEL is White_Space (JavaScript's \s lacks it)
		{"a\u3000\u3000b", "a|\u3000|\u3000b"},
		{"😀😀 😀", "😀😀| 😀"},
		{"\xffab", "\xffab"}, // an invalid byte is "other", like punctuation
		{"1\r\n2", "1|\r\n|2"},
		{"!\r\n\r\nx", "!\r\n\r\n|x"},
	}
	for _, tc := range tests {
		if got := strings.Join(pieces(splitLlama3, tc.in), "|"); got != tc.want {
			t.Errorf("splitLlama3(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSplitGPT2(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Hello world", "Hello| world"},
		{"It's I'M", "It|'s| I|'|M"},
		{"12345 67", "12345| 67"},
		{"hello, world!!", "hello|,| world|!!"},
		{"a  b", "a| | b"},
		{"a\t b", "a|\t| b"},
		{"a\tb", "a|\t|b"},
		{"a\n\nb", "a|\n|\n|b"},
		{"trailing  ", "trailing|  "},
		{" ,x", " ,|x"},
		{"x \u0085y", "x| |\u0085|y"},
	}
	for _, tc := range tests {
		if got := strings.Join(pieces(splitGPT2, tc.in), "|"); got != tc.want {
			t.Errorf("splitGPT2(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzSplit checks what holds for any input: the pieces are non-empty,
// consecutive, cover the input, and come out the same every time.
func FuzzSplit(f *testing.F) {
	for _, s := range []string{"Hello world", "It's 12345", "a \n  b", "😀 \u00a0x", "\xff\xfe", "'S'll\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, split := range map[string]splitter{"gpt2": splitGPT2, "llama3": splitLlama3} {
			next := 0
			split(s, func(a, b int) {
				if a != next || b <= a || b > len(s) {
					t.Fatalf("%s(%q): piece [%d, %d) after %d", name, s, a, b, next)
				}
				next = b
			})
			if next != len(s) {
				t.Fatalf("%s(%q): pieces end at %d of %d", name, s, next, len(s))
			}
			if got := pieces(split, s); !slices.Equal(got, pieces(split, s)) {
				t.Fatalf("%s: not deterministic", name)
			}
		}
	})
}
