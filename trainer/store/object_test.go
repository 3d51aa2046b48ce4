package store_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/internal/s3test"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/store"
)

// TestObjectAsTokenFile: a run's token file in a bucket is read with range
// requests into a data.Provider, with the trainer's keys at its named
// endpoint; anonymously the bucket refuses it, naming the setting; a
// missing object is data.ErrNotFound; an object replaced while it is read
// fails the read (data.ErrChanged) instead of mixing two files.
func TestObjectAsTokenFile(t *testing.T) {
	srv := s3test.Start(t)
	srv.Bucket(t, "tokens")
	ctx := context.Background()
	text := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 40)
	file, err := data.EncodeTokens(nil, data.Tokenize([]byte(text)), data.TokenSize16)
	if err != nil {
		t.Fatal(err)
	}
	// Put through the S3 API (Upload: run/train.bin), so that the object
	// has the ETag of its bytes.
	s := open(t, srv, "s3://tokens")
	local := filepath.Join(t.TempDir(), "train.bin")
	put := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(local, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := s.Upload(ctx, local, "s3://tokens/run"); err != nil {
			t.Fatal(err)
		}
	}
	put(file)
	o, err := s.OpenObject(ctx, "run/train.bin")
	if err != nil {
		t.Fatal(err)
	}
	p, err := data.NewProvider(ctx, o, data.TokenSize16, 32)
	if err != nil {
		t.Fatal(err)
	}
	seq, err := p.Sequence(ctx, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := data.Detokenize(seq); string(got) != text[96:129] {
		t.Fatalf("sequence 3 is %q, want %q", got, text[96:129])
	}
	if want := "s3://tokens/run/train.bin at " + srv.Endpoint; p.Source() != want {
		t.Errorf("source %q, want %q", p.Source(), want)
	}

	if _, err := s.OpenObject(ctx, "run/missing.bin"); !errors.Is(err, data.ErrNotFound) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing object: %v", err)
	}
	// Not the trainer's named endpoint: anonymous, refused by the bucket,
	// and the error says which setting sends the keys.
	anon, err := store.Open(store.Config{URL: "s3://tokens", Endpoint: srv.Endpoint},
		store.WithAccess(store.Access{AllowHTTP: true}), store.WithLocalEndpoints())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.OpenObject(ctx, "run/train.bin"); !errors.Is(err, store.ErrCredentials) || !strings.Contains(err.Error(), store.EnvEndpoint) {
		t.Errorf("anonymous read: %v", err)
	}

	// Replaced under the reader (same size, other bytes).
	changed := append([]byte(nil), file...)
	changed[0] ^= 1
	put(changed)
	if _, err := p.Sequence(ctx, 0, nil); !errors.Is(err, data.ErrChanged) {
		t.Errorf("reading a replaced object: %v", err)
	}
}
