package soltest

import (
	"crypto/ed25519"
	"crypto/sha256"
	"testing"
)

func TestOnCurve(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(nil)
	if !OnCurve(pub) {
		t.Error("an ed25519 public key is not on the curve")
	}
	// About half of all 32-byte strings decode to a point. (That derived
	// addresses are right is shown by the loader and the coordinator program
	// accepting them, in programs/validator's and programs/coordinator's
	// tests.)
	on := 0
	for i := 0; i < 256; i++ {
		h := sha256.Sum256([]byte{byte(i)})
		if OnCurve(h[:]) {
			on++
		}
	}
	if on < 96 || on > 160 {
		t.Errorf("%d of 256 hashes on the curve, want about half", on)
	}
}

func TestCompactU16(t *testing.T) {
	for _, tt := range []struct {
		n    int
		want []byte
	}{{0, []byte{0}}, {0x7f, []byte{0x7f}}, {0x80, []byte{0x80, 1}}, {0x3fff, []byte{0xff, 0x7f}}, {0x4000, []byte{0x80, 0x80, 1}}} {
		if got := AppendCompactU16(nil, tt.n); string(got) != string(tt.want) {
			t.Errorf("%#x: %x, want %x", tt.n, got, tt.want)
		}
	}
}

// TestCompileTx: the header counts, key order and signatures of a
// transaction with a signer that is not the payer and a read-only program.
func TestCompileTx(t *testing.T) {
	_, payer, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	program, writable := make([]byte, 32), make([]byte, 32)
	program[0], writable[0] = 7, 9
	bh := make([]byte, 32)
	tx := CompileTx(payer, []ed25519.PrivateKey{other}, bh, Instruction{Program: program,
		Accounts: []Meta{{Key: writable, Writable: true}, {Key: Pub(other), Signer: true}}, Data: []byte{1, 2}})
	if tx[0] != 2 {
		t.Fatalf("%d signatures, want 2", tx[0])
	}
	msg := tx[1+2*64:]
	if msg[0] != 2 || msg[1] != 1 || msg[2] != 1 {
		t.Fatalf("header %v, want [2 1 1] (two signers, one read-only; one read-only unsigned)", msg[:3])
	}
	keys := msg[4 : 4+4*32]
	for i, want := range [][]byte{Pub(payer), Pub(other), writable, program} {
		if string(keys[i*32:(i+1)*32]) != string(want) {
			t.Fatalf("key %d out of order", i)
		}
	}
	if !ed25519.Verify(Pub(payer), msg, tx[1:65]) || !ed25519.Verify(Pub(other), msg, tx[65:129]) {
		t.Fatal("a signature does not verify")
	}
}
