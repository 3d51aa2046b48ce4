package tokenizer

import (
	"os"
	"testing"
)

// BenchmarkEncode measures tokenization throughput on the Opticks corpus
// (567 KB) with the real Llama 3 and Llama 2 tokenizer.json files: bytes/s
// (MB/s) and tokens/s. Each iteration uses a fresh tokenizer, so the word
// cache starts empty as it does for a new file.
func BenchmarkEncode(b *testing.B) {
	corpus, err := os.ReadFile("../data/corpus/opticks.txt")
	if err != nil {
		b.Fatal(err)
	}
	for _, model := range []string{"llama3", "llama2"} {
		b.Run(model, func(b *testing.B) {
			raw, err := os.ReadFile(needReference(b, model))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(corpus)))
			tokens := 0
			for b.Loop() {
				b.StopTimer()
				tok, err := Parse(raw)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				ids, err := tok.Encode(nil, string(corpus), true)
				if err != nil {
					b.Fatal(err)
				}
				tokens += len(ids)
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkParse measures loading the Llama 3 tokenizer.json (9 MB).
func BenchmarkParse(b *testing.B) {
	raw, err := os.ReadFile(needReference(b, "llama3"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := Parse(raw); err != nil {
			b.Fatal(err)
		}
	}
}
