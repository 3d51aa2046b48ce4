package chain

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

func TestBase58(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{nil, ""},
		{[]byte{0}, "1"},
		{[]byte("Hello World!"), "2NEpo7TZRRrLZSi2U"},
		{[]byte{0, 0, 0x28, 0x7f, 0xb4, 0xcd}, "11233QC4"},
		{make([]byte, 32), "11111111111111111111111111111111"},
	} {
		if got := Base58(tc.in); got != tc.want {
			t.Errorf("Base58(%x) = %q, want %q", tc.in, got, tc.want)
		}
		back, err := DecodeBase58(tc.want)
		if err != nil || !bytes.Equal(back, tc.in) && !(len(back) == 0 && len(tc.in) == 0) {
			t.Errorf("DecodeBase58(%q) = %x, %v", tc.want, back, err)
		}
	}
	if _, err := DecodeBase58("0OIl"); err == nil {
		t.Error("accepted characters outside the alphabet")
	}
	k := coordinator.Pubkey(sha256.Sum256([]byte("x")))
	if got, err := ParseAddress(Address(k)); err != nil || got != k {
		t.Errorf("address round trip: %v", err)
	}
}

func FuzzBase58(f *testing.F) {
	f.Add([]byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		back, err := DecodeBase58(Base58(b))
		if err != nil || !bytes.Equal(back, b) && len(b) > 0 {
			t.Fatalf("%x -> %q -> %x %v", b, Base58(b), back, err)
		}
	})
}

func TestKeypairFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "id.json")
	k, err := NewKeypair()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Save(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	if err := k.Save(context.Background(), path); err == nil {
		t.Fatal("overwrote a key file")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", st.Mode().Perm())
	}
	got, err := LoadKeypair(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Public() != k.Public() || !Verify(k.Public(), []byte("m"), got.Sign([]byte("m"))) {
		t.Fatal("loaded key differs")
	}
	for name, content := range map[string]string{
		"short":    "[1,2,3]",
		"not json": "hello",
		"range":    "[" + strings.Repeat("300,", 63) + "1]",
		"mismatch": "[" + strings.Repeat("1,", 63) + "1]",
	} {
		p := filepath.Join(dir, name)
		_ = os.WriteFile(p, []byte(content), 0o600)
		if _, err := LoadKeypair(p); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}
