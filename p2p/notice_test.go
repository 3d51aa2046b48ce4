package p2p

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

func sampleNotice(t testing.TB) Notice {
	n := Notice{RunID: "run-7", Step: 42, Batch: BatchRange{Start: 1000, End: 1016},
		Trainer: coordinator.ClientID{Signer: coordinator.Pubkey{9, 9, 9}}, Nonce: 0x0102030405060708}
	if err := n.Sign(testKey("wire")); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNoticeLayout checks the offset table in notice.go.
func TestNoticeLayout(t *testing.T) {
	n := sampleNotice(t)
	b, err := n.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	L := len(n.RunID)
	le32, le64 := binary.LittleEndian.Uint32, binary.LittleEndian.Uint64
	for _, c := range []struct {
		field string
		ok    bool
	}{
		{"kind", b[0] == 16},
		{"run id length", int(b[1]) == L},
		{"run id", string(b[2:2+L]) == n.RunID},
		{"step", le32(b[2+L:]) == n.Step},
		{"batch start", le64(b[6+L:]) == n.Batch.Start},
		{"batch end", le64(b[14+L:]) == n.Batch.End},
		{"signer", bytes.Equal(b[22+L:54+L], n.Trainer.Signer[:])},
		{"p2p key", bytes.Equal(b[54+L:86+L], n.Trainer.P2P[:])},
		{"nonce", le64(b[86+L:]) == n.Nonce},
		{"signature", bytes.Equal(b[94+L:], n.Signature[:])},
		{"length", len(b) == 94+L+ed25519.SignatureSize},
		{"signed over its domain", ed25519.Verify(n.Trainer.P2P[:], append([]byte("psyche/notice/v1"), b[:94+L]...), n.Signature[:])},
	} {
		if !c.ok {
			t.Errorf("%s is not where the table says", c.field)
		}
	}
}

// The bytes of a notice signed by a fixed key are these (ed25519 signs
// deterministically): a change of layout or signing domain shows here.
func TestNoticeTranscript(t *testing.T) {
	n := sampleNotice(t)
	b, err := n.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want := "10" + "05" + "72756e2d37" + "2a000000" + "e803000000000000" + "f803000000000000" + // kind, run id, step, batch
		"0909090000000000000000000000000000000000000000000000000000000000" + // signer
		"4efe7fe1776ab098b9acd1cec7c99dcb2aa3fb6dcc182012a6dbb1712f319444" + // p2p key
		"0807060504030201" + // nonce
		"a63c04bbbd35c0bce61047dc5ca841827e5e9b4d9655c91197483be2f1ba5117" +
		"0922f21f05486ca81d0dd78b27cc3947981ea41662c0cebc796fa68fa0f56407" // signature
	if got := hex.EncodeToString(b); got != want {
		t.Fatalf("notice bytes\n got %s\nwant %s", got, want)
	}
}

func TestNoticeRoundTripAndTamper(t *testing.T) {
	n := sampleNotice(t)
	b, _ := n.MarshalBinary()
	got, err := DecodeNotice(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, n) {
		t.Fatalf("round trip: got %+v", got)
	}
	if err := got.Verify(); err != nil {
		t.Fatal(err)
	}
	if !IsNotice(b) {
		t.Error("IsNotice: false for a notice")
	}
	// Every byte but the kind and the run id's length, flipped, either
	// fails to decode or fails the signature.
	for i := 2; i < len(b); i++ {
		bad := bytes.Clone(b)
		bad[i] ^= 0x40
		d, err := DecodeNotice(bad)
		if err == nil {
			err = d.Verify()
		}
		if err == nil {
			t.Errorf("byte %d flipped: still valid", i)
		}
	}
	for name, c := range map[string]struct {
		b    []byte
		want error
	}{
		"short":        {b[:len(b)-1], ErrShortBuffer},
		"trailing":     {append(bytes.Clone(b), 0), ErrTrailingBytes},
		"announcement": {append([]byte{announcementVersion}, b[1:]...), ErrVersion},
		"empty":        {nil, ErrShortBuffer},
	} {
		if _, err := DecodeNotice(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// Neither message decodes as the other.
	if _, err := DecodeAnnouncement(b); !errors.Is(err, ErrVersion) {
		t.Errorf("a notice decoded as an announcement: %v", err)
	}
	a := sampleAnnouncement(t)
	ab, _ := a.MarshalBinary()
	if IsNotice(ab) {
		t.Error("IsNotice: true for an announcement")
	}
}

// A notice's signature is over its own domain: the same bytes signed for
// another domain (as an announcement's signature is) do not verify.
func TestNoticeSigningDomain(t *testing.T) {
	key := testKey("wire")
	n := sampleNotice(t)
	copy(n.Signature[:], ed25519.Sign(key, signingMessage(n.signedBytes())))
	if err := n.Verify(); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("signed over the announcement domain: %v", err)
	}
}

// The largest notice (the longest run id) is MaxNoticeSize, one byte more
// is refused unread, and a batch that ends before it starts is malformed.
func TestNoticeBounds(t *testing.T) {
	n := sampleNotice(t)
	n.RunID = strings.Repeat("r", coordinator.MaxRunIDLen)
	if err := n.Sign(testKey("wire")); err != nil {
		t.Fatal(err)
	}
	b, err := n.MarshalBinary()
	if err != nil || len(b) != MaxNoticeSize {
		t.Fatalf("the largest notice: %d bytes (max %d), %v", len(b), MaxNoticeSize, err)
	}
	if _, err := DecodeNotice(append(b, 0)); !errors.Is(err, ErrOversize) {
		t.Errorf("one byte over: %v", err)
	}
	long := n
	long.RunID += "r"
	if err := long.Sign(testKey("wire")); !errors.Is(err, ErrMalformed) {
		t.Errorf("a run id of %d bytes: %v", len(long.RunID), err)
	}
	back := sampleNotice(t)
	back.Batch = BatchRange{Start: 5, End: 4}
	if err := back.Sign(testKey("wire")); !errors.Is(err, ErrMalformed) {
		t.Errorf("batch [5, 4): %v", err)
	}
	bad := sampleNotice(t)
	raw := bad.signedBytes()
	binary.LittleEndian.PutUint64(raw[2+5+4:], 2000) // start after end
	if _, err := DecodeNotice(append(raw, make([]byte, ed25519.SignatureSize)...)); !errors.Is(err, ErrMalformed) {
		t.Errorf("decoding batch [2000, 1016): %v", err)
	}
}

// FuzzDecodeNotice: whatever decodes re-encodes to the same bytes, within
// the production size limit.
func FuzzDecodeNotice(f *testing.F) {
	sample := sampleNotice(f)
	b, _ := sample.MarshalBinary()
	f.Add(b)
	empty := Notice{}
	eb, _ := empty.MarshalBinary()
	f.Add(eb)
	f.Add([]byte{noticeKind, 0})
	f.Add([]byte{announcementVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := DecodeNotice(b)
		if err != nil {
			return
		}
		if len(b) > MaxNoticeSize || !IsNotice(b) {
			t.Fatalf("decoded %d bytes starting %d", len(b), b[0])
		}
		_ = n.Verify()
		again, err := n.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}
