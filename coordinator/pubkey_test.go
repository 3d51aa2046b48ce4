package coordinator

import (
	"bytes"
	"crypto/sha256"
	"strings"
	"testing"
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
	k := Pubkey(sha256.Sum256([]byte("x")))
	if got, err := ParsePubkey(k.String()); err != nil || got != k {
		t.Errorf("address round trip: %v", err)
	}
}

// FuzzBase58 round-trips bytes, and decodes any string without panicking
// (addresses come from users and run files).
func FuzzBase58(f *testing.F) {
	f.Add([]byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		back, err := DecodeBase58(Base58(b))
		if err != nil || !bytes.Equal(back, b) && len(b) > 0 {
			t.Fatalf("%x -> %q -> %x %v", b, Base58(b), back, err)
		}
		if k, err := ParsePubkey(string(b)); err == nil && k.String() != string(b) {
			t.Fatalf("ParsePubkey(%q) = %s: not the same address", b, k)
		}
	})
}

func TestParsePubkeyRejects(t *testing.T) {
	for _, s := range []string{"", "1111", "0OIl", strings.Repeat("z", 45)} {
		if k, err := ParsePubkey(s); err == nil {
			t.Errorf("ParsePubkey(%q) = %s, want an error", s, k)
		}
	}
	if k, err := ParsePubkey("SysvarS1otHashes111111111111111111111111111"); err != nil || k.String() != "SysvarS1otHashes111111111111111111111111111" {
		t.Errorf("the SlotHashes sysvar: %s, %v", k, err)
	}
}
