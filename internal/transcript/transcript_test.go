package transcript

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// echo is a harness with one command, "set value=N [word]", that prints
// N and, when the line has a positional word and read is true, the word.
func echo(read bool) func(a *Args) string {
	return func(a *Args) string {
		out := "value " + a.GetOr("value", "0")
		if read {
			out += " " + strings.Join(a.Pos(), " ")
		}
		return out
	}
}

func TestReplay(t *testing.T) {
	const good = "# a transcript\nset value=3\n----\nvalue 3\n\n"
	for _, tc := range []struct {
		name     string
		text     string
		readPos  bool
		rewrite  bool
		problems []string // each a substring of one problem, in order
		after    string   // the file after a rewrite; "" means unchanged
	}{
		{name: "matches", text: good},
		{name: "misspelt key", text: "# a transcript\nset vaule=3\n----\nvalue 0\n\n",
			problems: []string{`t.txt:2: command "set" does not read "vaule"`}},
		{name: "stray word", text: "set value=3 loud\n----\nvalue 3\n\n",
			problems: []string{`t.txt:1: command "set" does not read "loud"`}},
		{name: "word read", text: "set value=3 loud\n----\nvalue 3 loud\n\n", readPos: true},
		{name: "wrong output", text: "\nset value=3\n----\nvalue 4\n\n",
			problems: []string{"t.txt:2: set value=3\n got:\nvalue 3\n"}},
		{name: "rewrite keeps trailing comments", text: good + "# the end\n\n# really\n", rewrite: true},
		{name: "rewrite fixes output", text: "set value=3\n----\nvalue 4\n\n# kept\n", rewrite: true,
			after: "set value=3\n----\nvalue 3\n\n# kept\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "t.txt")
			if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			problems, err := replay(path, tc.rewrite, echo(tc.readPos))
			if err != nil {
				t.Fatal(err)
			}
			if len(problems) != len(tc.problems) {
				t.Fatalf("problems %q, want %d like %q", problems, len(tc.problems), tc.problems)
			}
			for i, want := range tc.problems {
				if !strings.Contains(problems[i], want) {
					t.Errorf("problem %q does not say %q", problems[i], want)
				}
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.text
			if tc.after != "" {
				want = tc.after
			}
			if string(b) != want {
				t.Errorf("file after replay:\n%q\nwant\n%q", b, want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"set value=1\nvalue 1\n", `t.txt:2: want ---- after the command, got "value 1"`},
		{"# c\nset value=1\n", `t.txt:2: command "set value=1" has no output section`},
	} {
		path := filepath.Join(t.TempDir(), "t.txt")
		if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := parse(path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.text, err, tc.want)
		}
	}
}
