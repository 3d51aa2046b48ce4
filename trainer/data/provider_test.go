package data

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeTemp writes tokens to a fresh token file and returns its path.
func writeTemp(t testing.TB, tokens []uint32, tokenSize int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.bin")
	if err := WriteTokenFile(context.Background(), path, tokens, tokenSize); err != nil {
		t.Fatal(err)
	}
	return path
}

// countingTokens returns 0, 1, …, n−1: a sequence's first token tells where
// it starts.
func countingTokens(n int) []uint32 {
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	return tokens
}

func openProvider(t testing.TB, location string, tokenSize, seqLen int, opts ...Option) *Provider {
	t.Helper()
	p, err := Open(context.Background(), location, tokenSize, seqLen, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestProviderSequencesFollowTheFile(t *testing.T) {
	for _, tc := range []struct {
		numTokens, seqLen, tokenSize int
		wantSeqs                     uint64
	}{
		{2, 1, 2, 1},
		{10, 3, 2, 3}, // [0,4) [3,7) [6,10)
		{11, 5, 4, 2},
		{12, 5, 2, 2}, // the last token is never a sequence start
		{1000, 7, 2, 142},
		{1000, 999, 4, 1},
	} {
		t.Run(fmt.Sprintf("T%d_S%d_u%d", tc.numTokens, tc.seqLen, 8*tc.tokenSize), func(t *testing.T) {
			tokens := countingTokens(tc.numTokens)
			p := openProvider(t, writeTemp(t, tokens, tc.tokenSize), tc.tokenSize, tc.seqLen)
			if p.NumSequences() != tc.wantSeqs || p.NumTokens() != uint64(tc.numTokens) ||
				p.SeqLen() != tc.seqLen || p.TokenSize() != tc.tokenSize {
				t.Fatalf("N=%d T=%d S=%d size=%d", p.NumSequences(), p.NumTokens(), p.SeqLen(), p.TokenSize())
			}
			for d := range 3 * p.NumSequences() {
				seq, err := p.Sequence(context.Background(), d, nil)
				if err != nil {
					t.Fatal(err)
				}
				i := d % p.NumSequences()
				want := tokens[i*uint64(tc.seqLen) : i*uint64(tc.seqLen)+uint64(tc.seqLen)+1]
				if !slices.Equal(seq, want) {
					t.Fatalf("data index %d: %v, want %v", d, seq, want)
				}
			}
		})
	}
}

func TestProviderVisitsEverySequenceOncePerPeriod(t *testing.T) {
	const seqLen = 4
	tokens := countingTokens(seqLen*97 + 3) // N = 97 (prime) … and spare tokens
	path := writeTemp(t, tokens, 2)
	orders := map[string][]uint64{}
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"file order", nil},
		{"seed 0", []Option{WithShuffleSeed(0)}},
		{"seed 1", []Option{WithShuffleSeed(1)}},
		{"seed 2", []Option{WithShuffleSeed(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := openProvider(t, path, 2, seqLen, tc.opts...)
			again := openProvider(t, path, 2, seqLen, tc.opts...)
			n := p.NumSequences()
			if n != 97 {
				t.Fatalf("N = %d", n)
			}
			for _, start := range []uint64{0, 5, 3*n + 11, math.MaxUint64 - n + 1} {
				seen := make([]bool, n)
				var order []uint64
				for k := range n {
					d := start + k
					seq, err := p.Sequence(context.Background(), d, nil)
					if err != nil {
						t.Fatal(err)
					}
					i := uint64(seq[0]) / seqLen // countingTokens: the first token is the start
					if i != p.SequenceIndex(d) || i != again.SequenceIndex(d) {
						t.Fatalf("data index %d: read sequence %d, SequenceIndex says %d, a second provider %d",
							d, i, p.SequenceIndex(d), again.SequenceIndex(d))
					}
					if seen[i] {
						t.Fatalf("start %d: sequence %d produced twice", start, i)
					}
					seen[i] = true
					order = append(order, i)
				}
				if start == 0 {
					orders[tc.name] = order
				}
			}
		})
	}
	if !slices.Equal(orders["file order"], countingTokens64(97)) {
		t.Error("without a seed the order is not the file order")
	}
	for _, a := range []string{"file order", "seed 0", "seed 1"} {
		for _, b := range []string{"seed 0", "seed 1", "seed 2"} {
			if a != b && slices.Equal(orders[a], orders[b]) {
				t.Errorf("%s and %s give the same order", a, b)
			}
		}
	}
}

func countingTokens64(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i)
	}
	return out
}

func TestProviderReusesDst(t *testing.T) {
	p := openProvider(t, writeTemp(t, countingTokens(100), 2), 2, 9)
	buf := make([]uint32, 3, 64)
	seq, err := p.Sequence(context.Background(), 1, buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(seq) != 10 || &seq[0] != &buf[:1][0] {
		t.Fatalf("len %d, reallocated: %v", len(seq), &seq[0] != &buf[:1][0])
	}
	small := make([]uint32, 0, 4)
	if seq, err = p.Sequence(context.Background(), 1, small); err != nil || len(seq) != 10 || seq[0] != 9 {
		t.Fatalf("small dst: %v %v", seq, err)
	}
}

func TestProviderRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := writeTemp(t, countingTokens(100), 2)
	short := writeTemp(t, countingTokens(8), 2)
	odd := write("odd.bin", make([]byte, 101))
	six := write("six.bin", make([]byte, 6))
	empty := write("empty.bin", nil)
	for _, tc := range []struct {
		name      string
		location  string
		tokenSize int
		seqLen    int
		opts      []Option
		want      error  // nil: any error
		msg       string // the error must contain it
	}{
		{"seqLen 0", good, 2, 0, nil, nil, "sequence length must be positive"},
		{"seqLen negative", good, 2, -5, nil, nil, "sequence length must be positive"},
		{"token size 3", good, 3, 8, nil, nil, "token size must be 2 or 4"},
		{"token size 8", good, 8, 8, nil, nil, "token size must be 2 or 4"},
		{"too short", short, 2, 8, nil, ErrTooShort, "8 tokens"},
		{"exactly one token short", good, 2, 100, nil, ErrTooShort, "needs 101"},
		{"empty", empty, 2, 1, nil, ErrTooShort, "0 tokens"},
		{"odd bytes", odd, 2, 4, nil, ErrMisaligned, "101 bytes"},
		{"u32 of 6 bytes", six, 4, 1, nil, ErrMisaligned, "6 bytes"},
		{"missing file", filepath.Join(dir, "nope.bin"), 2, 4, nil, ErrNotFound, "nope.bin"},
		{"missing file URL", "file://" + filepath.Join(dir, "nope.bin"), 2, 4, nil, ErrNotFound, "nope.bin"},
		{"directory", dir, 2, 4, nil, nil, "is a directory"},
		{"remote file URL", "file://example.com/x.bin", 2, 4, nil, nil, "only local files"},
		{"unsupported scheme", "gs://bucket/x.bin", 2, 4, nil, nil, `unsupported location scheme "gs"`},
		{"s3 without an opener", "s3://bucket/x.bin", 2, 4, nil, nil, "WithObjectOpener"},
		{"server without a server", "server:x.bin", 2, 4, nil, nil, "talks to none"},
		{"URL without host", "http:///x.bin", 2, 4, nil, nil, "no host"},
		{"nil option", good, 2, 4, []Option{nil}, nil, "nil Option"},
		{"negative retries", good, 2, 4, []Option{WithRetries(-1)}, nil, "must not be negative"},
		{"zero backoff", good, 2, 4, []Option{WithBackoff(0, time.Second)}, nil, "0 < base ≤ limit"},
		{"inverted backoff", good, 2, 4, []Option{WithBackoff(time.Second, time.Millisecond)}, nil, "0 < base ≤ limit"},
		{"negative timeout", good, 2, 4, []Option{WithRequestTimeout(-1)}, nil, "must not be negative"},
		{"nil logger", good, 2, 4, []Option{WithLogger(nil)}, nil, "nil logger"},
		{"nil client", good, 2, 4, []Option{WithHTTPClient(nil)}, nil, "nil client"},
		{"zero vocabulary", good, 2, 4, []Option{WithVocabSize(0)}, nil, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Open(context.Background(), tc.location, tc.tokenSize, tc.seqLen, tc.opts...)
			if err == nil {
				p.Close()
				t.Fatal("no error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "data: ") || strings.Count(err.Error(), "data: ") != 1 {
				t.Errorf("error %q should carry the package prefix once", err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q lacks %q", err, tc.msg)
			}
		})
	}
	if _, err := NewProvider(context.Background(), nil, 2, 4); err == nil {
		t.Error("nil Source accepted")
	}
}

// A local file is checked whole when it is opened: a token outside the
// vocabulary fails before any training, naming the file and the run's
// field. A remote file is checked sequence by sequence.
func TestProviderChecksVocabulary(t *testing.T) {
	tokens := Tokenize([]byte("abcdefghijklmnop"))
	tokens[9] = 300 // in the sequence [8, 13)
	path := writeTemp(t, tokens, 2)
	_, err := Open(context.Background(), path, 2, 4, WithVocabSize(ByteVocabSize))
	if !errors.Is(err, ErrTokenRange) {
		t.Fatalf("local file: err = %v, want ErrTokenRange", err)
	}
	for _, want := range []string{path, "token 9 of the file is 300", "vocabulary size 256 (model.vocab_size)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, err := Open(context.Background(), path, 2, 4, WithVocabSize(301)); err != nil {
		t.Errorf("vocabulary 301: %v", err)
	}

	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(serveBytes(content))
	t.Cleanup(srv.Close)
	p := openProvider(t, srv.URL+"/tokens.bin", 2, 4, WithVocabSize(ByteVocabSize))
	for d := range p.NumSequences() {
		_, err := p.Sequence(context.Background(), d, nil)
		if hasBad := d == 2; hasBad != errors.Is(err, ErrTokenRange) {
			t.Errorf("sequence %d: err = %v", d, err)
		}
		if err != nil && !strings.Contains(err.Error(), "model.vocab_size") {
			t.Errorf("error %q does not name model.vocab_size", err)
		}
	}
}

func TestOpenAcceptsFileURLs(t *testing.T) {
	tokens := countingTokens(50)
	path := writeTemp(t, tokens, 4)
	for _, loc := range []string{path, "file://" + path, "file://localhost" + path, "FILE://" + path} {
		p := openProvider(t, loc, 4, 7, WithShuffleSeed(3))
		seq, err := p.Sequence(context.Background(), 4, nil)
		if err != nil {
			t.Fatalf("%s: %v", loc, err)
		}
		i := p.SequenceIndex(4)
		if !slices.Equal(seq, tokens[i*7:i*7+8]) {
			t.Fatalf("%s: wrong sequence %v", loc, seq)
		}
	}
}

func TestProviderLocalFileTruncatedAfterOpen(t *testing.T) {
	path := writeTemp(t, countingTokens(100), 2)
	p := openProvider(t, path, 2, 9)
	if err := os.Truncate(path, 50); err != nil {
		t.Fatal(err)
	}
	_, err := p.Sequence(context.Background(), p.NumSequences()-1, nil)
	if !errors.Is(err, ErrShortRead) {
		t.Fatalf("err = %v, want ErrShortRead", err)
	}
	if !strings.Contains(err.Error(), "the file has 50") {
		t.Errorf("unclear error %q", err)
	}
	if _, err := p.Sequence(context.Background(), 0, nil); err != nil {
		t.Errorf("the part still there: %v", err)
	}
}

func TestProviderCancelledContext(t *testing.T) {
	p := openProvider(t, writeTemp(t, countingTokens(100), 2), 2, 9)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Sequence(ctx, 0, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// TestLocalAndHTTPSourcesAgree reads every sequence of the Opticks token file
// from disk and over HTTP (a real server on 127.0.0.1 with http.ServeContent),
// with and without shuffling, and from several goroutines at once.
func TestLocalAndHTTPSourcesAgree(t *testing.T) {
	for _, tokenSize := range []int{2, 4} {
		path := writeTemp(t, Tokenize(Opticks()), tokenSize)
		content, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(serveBytes(content))
		t.Cleanup(srv.Close)
		for _, opts := range [][]Option{nil, {WithShuffleSeed(77)}} {
			const seqLen = 2048
			local := openProvider(t, path, tokenSize, seqLen, opts...)
			remote := openProvider(t, srv.URL+"/opticks.bin", tokenSize, seqLen, opts...)
			n := local.NumSequences()
			if remote.NumSequences() != n || n != (567198-1)/seqLen {
				t.Fatalf("N: local %d, remote %d", n, remote.NumSequences())
			}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for w := range uint64(4) {
				wg.Go(func() {
					var a, b []uint32
					for d := w; d < n; d += 4 {
						var err error
						if a, err = local.Sequence(context.Background(), d, a); err != nil {
							errs <- err
							return
						}
						if b, err = remote.Sequence(context.Background(), d, b); err != nil {
							errs <- err
							return
						}
						if !slices.Equal(a, b) {
							errs <- fmt.Errorf("data index %d: local and HTTP differ", d)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		}
	}
}

// serveBytes serves content with http.ServeContent, so Range works.
func serveBytes(content []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "tokens.bin", time.Time{}, strings.NewReader(string(content)))
	})
}

func BenchmarkSequenceLocalFile(b *testing.B) {
	for _, tc := range []struct {
		name   string
		seqLen int
		opts   []Option
	}{
		{"seq512", 512, nil},
		{"seq512_shuffled", 512, []Option{WithShuffleSeed(1)}},
		{"seq4096_shuffled", 4096, []Option{WithShuffleSeed(1)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := openProvider(b, writeTemp(b, Tokenize(Opticks()), 2), 2, tc.seqLen, tc.opts...)
			dst := make([]uint32, tc.seqLen+1)
			ctx := context.Background()
			b.SetBytes(int64(tc.seqLen+1) * 2)
			b.ReportAllocs()
			var d uint64
			for b.Loop() {
				var err error
				if dst, err = p.Sequence(ctx, d, dst); err != nil {
					b.Fatal(err)
				}
				d++
			}
		})
	}
}

func TestBytesSourceMatchesFileSource(t *testing.T) {
	ctx := context.Background()
	tokens := Tokenize(Opticks()[:20000])
	enc, err := EncodeTokens(nil, tokens, TokenSize16)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokens.bin")
	if err := WriteTokenFile(ctx, path, tokens, TokenSize16); err != nil {
		t.Fatal(err)
	}
	mem, err := NewProvider(ctx, NewBytesSource(enc), TokenSize16, 64, WithShuffleSeed(3))
	if err != nil {
		t.Fatal(err)
	}
	file, err := Open(ctx, path, TokenSize16, 64, WithShuffleSeed(3))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for d := uint64(0); d < 50; d++ {
		a, err1 := mem.Sequence(ctx, d, nil)
		b, err2 := file.Sequence(ctx, d, nil)
		if err1 != nil || err2 != nil || !slices.Equal(a, b) {
			t.Fatalf("index %d: %v %v", d, err1, err2)
		}
	}
	if _, err := NewBytesSource(enc).Size(ctx); err != nil {
		t.Fatal(err)
	}
	if err := NewBytesSource(enc[:10]).ReadAt(ctx, make([]byte, 4), 8); !errors.Is(err, ErrShortRead) {
		t.Fatalf("got %v", err)
	}
}
