package data

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestTokenBytesRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tokenSize int
		tokens    []uint32
		encoded   []byte
	}{
		{"u16 empty", 2, nil, nil},
		{"u16", 2, []uint32{0, 1, 0x1234, math.MaxUint16}, []byte{0, 0, 1, 0, 0x34, 0x12, 0xff, 0xff}},
		{"u32", 4, []uint32{0, 0x01020304, math.MaxUint32}, []byte{0, 0, 0, 0, 4, 3, 2, 1, 0xff, 0xff, 0xff, 0xff}},
		{"u32 small", 4, []uint32{7}, []byte{7, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := EncodeTokens([]byte("prefix"), tc.tokens, tc.tokenSize)
			if err != nil {
				t.Fatal(err)
			}
			if want := append([]byte("prefix"), tc.encoded...); !bytes.Equal(enc, want) {
				t.Fatalf("encoded % x, want % x", enc, want)
			}
			dec, err := DecodeTokens([]uint32{42}, tc.encoded, tc.tokenSize)
			if err != nil {
				t.Fatal(err)
			}
			if want := append([]uint32{42}, tc.tokens...); !slices.Equal(dec, want) {
				t.Fatalf("decoded %v, want %v", dec, want)
			}
		})
	}
}

func TestTokenBytesErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tokenSize int
		tokens    []uint32
		want      error
	}{
		{"u16 overflow", 2, []uint32{1, math.MaxUint16 + 1}, ErrTokenRange},
		{"u16 far overflow", 2, []uint32{math.MaxUint32}, ErrTokenRange},
		{"width 3", 3, []uint32{1}, nil},
		{"width 8", 8, []uint32{1}, nil},
		{"width 0", 0, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("keep")
			out, err := EncodeTokens(dst, tc.tokens, tc.tokenSize)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if string(out) != "keep" {
				t.Fatalf("dst changed to %q", out)
			}
		})
	}
	if _, err := DecodeTokens(nil, make([]byte, 5), 2); !errors.Is(err, ErrMisaligned) {
		t.Errorf("odd length: err = %v, want ErrMisaligned", err)
	}
	if _, err := DecodeTokens(nil, make([]byte, 6), 4); !errors.Is(err, ErrMisaligned) {
		t.Errorf("6 bytes of u32: err = %v, want ErrMisaligned", err)
	}
	if _, err := DecodeTokens(nil, make([]byte, 6), 3); err == nil {
		t.Error("token size 3 accepted")
	}
}

func TestTokenFileRoundTrip(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// More than one write chunk, so the chunking is exercised.
	long := make([]uint32, writeChunkTokens*2+17)
	for i := range long {
		long[i] = uint32(i) * 2654435761 & math.MaxUint16
	}
	for _, tc := range []struct {
		name      string
		tokenSize int
		tokens    []uint32
	}{
		{"u16", 2, []uint32{1, 2, 3, math.MaxUint16}},
		{"u32", 4, []uint32{1, 2, 3, math.MaxUint32}},
		{"u16 long", 2, long},
		{"u32 long", 4, long},
		{"empty", 2, nil},
		{"opticks", 2, Tokenize(Opticks())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".tok")
			if err := WriteTokenFile(ctx, path, tc.tokens, tc.tokenSize); err != nil {
				t.Fatal(err)
			}
			info, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if info.Size() != int64(len(tc.tokens)*tc.tokenSize) {
				t.Fatalf("file has %d bytes, want %d", info.Size(), len(tc.tokens)*tc.tokenSize)
			}
			if info.Mode().Perm() != 0o644 {
				t.Errorf("mode %v, want 0644", info.Mode().Perm())
			}
			got, err := ReadTokenFile(ctx, path, tc.tokenSize)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.tokens) {
				t.Fatal("tokens changed on the way through the file")
			}
		})
	}
	assertNoTempFiles(t, dir)
}

func TestWriteTokenFileFailuresLeaveOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens.bin")
	old := []uint32{1, 2, 3}
	if err := WriteTokenFile(context.Background(), path, old, 2); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name      string
		ctx       context.Context
		tokens    []uint32
		tokenSize int
		want      error
	}{
		{"out of range", context.Background(), []uint32{4, 70000}, 2, ErrTokenRange},
		{"bad width", context.Background(), []uint32{4}, 3, nil},
		{"cancelled", cancelled, []uint32{4, 5}, 2, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WriteTokenFile(tc.ctx, path, tc.tokens, tc.tokenSize)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			got, err := ReadTokenFile(context.Background(), path, 2)
			if err != nil || !slices.Equal(got, old) {
				t.Fatalf("old file damaged: %v, %v", got, err)
			}
		})
	}
	if err := WriteTokenFile(context.Background(), filepath.Join(dir, "no", "such", "dir", "x.bin"), old, 2); err == nil {
		t.Error("write into a missing directory succeeded")
	}
	if _, err := ReadTokenFile(context.Background(), filepath.Join(dir, "missing.bin"), 2); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing file: err = %v, want ErrNotFound", err)
	}
	assertNoTempFiles(t, dir)
}

// assertNoTempFiles checks that only token files are left in dir.
func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name()[0] == '.' {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// FuzzDecodeTokens checks that decoding arbitrary bytes never panics, and
// that whatever decodes re-encodes to the same bytes.
func FuzzDecodeTokens(f *testing.F) {
	f.Add([]byte{}, 2)
	f.Add([]byte{1, 2, 3, 4}, 2)
	f.Add([]byte{1, 2, 3, 4}, 4)
	f.Add([]byte{1, 2, 3}, 2)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, 4)
	f.Add([]byte{1}, 3)
	f.Add([]byte{1, 2}, -1)
	f.Fuzz(func(t *testing.T, b []byte, tokenSize int) {
		tokens, err := DecodeTokens(nil, b, tokenSize)
		valid := (tokenSize == 2 || tokenSize == 4) && len(b)%tokenSize == 0
		if (err == nil) != valid {
			t.Fatalf("token size %d, %d bytes: err = %v", tokenSize, len(b), err)
		}
		if err != nil {
			return
		}
		if len(tokens) != len(b)/tokenSize {
			t.Fatalf("%d tokens from %d bytes", len(tokens), len(b))
		}
		enc, err := EncodeTokens(nil, tokens, tokenSize)
		if err != nil {
			t.Fatalf("decoded tokens do not re-encode: %v", err)
		}
		if !bytes.Equal(enc, b) {
			t.Fatalf("encode(decode(x)) = % x, want % x", enc, b)
		}
	})
}
