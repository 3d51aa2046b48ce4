package p2p

import (
	"crypto/ed25519"
	"encoding/binary"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
)

// The signed training notice: a trainer says it has begun work on its
// batch of a round. Witnesses give up on a trainer that has said nothing of
// a round once every other result is in (their patience); a trainer that
// has said it is training is waited for up to the round's training limit,
// as for any announced result. Without it a witness could not tell a slow
// trainer from a silent one, and an honest trainer slowed down (a busy
// machine) was dropped.
//
// It travels on the run's gossip topic beside the announcements, told
// apart by its first byte: an announcement's starts with its encoding
// version (2; versions stay below noticeKind), a notice's with noticeKind.
// All integers little-endian:
//
//	offset   size   field
//	0        1      kind (16)
//	1        1      run id length L (≤ 32)
//	2        L      run id
//	2+L      4      step
//	6+L      8      batch start (first data index)
//	14+L     8      batch end (one past the last data index)
//	22+L     32     trainer signer key
//	54+L     32     trainer p2p key (ed25519, signs this message)
//	86+L     8      nonce
//	94+L     64     ed25519 signature over "psyche/notice/v1" ‖ bytes [0, 94+L)
//
// The signing domain differs from the announcement's, so neither message's
// signature can be taken for the other's. The nonce makes each re-send a
// distinct gossip message, as for announcements.
const (
	noticeKind = 16
	// MaxNoticeSize is the largest encoded notice: the topic validator
	// refuses anything longer that starts with noticeKind unread.
	MaxNoticeSize = 2 + coordinator.MaxRunIDLen + 92 + ed25519.SignatureSize
)

var noticeDomain = []byte("psyche/notice/v1")

// Notice says that Trainer has begun training Batch of Step.
type Notice struct {
	RunID     string
	Step      uint32
	Batch     BatchRange
	Trainer   coordinator.ClientID
	Nonce     uint64
	Signature [ed25519.SignatureSize]byte
}

// NoticeKey names a notice independently of its nonce: one trainer's
// notice of one batch, the same however often it is re-sent.
type NoticeKey struct {
	P2P   coordinator.Pubkey
	Step  uint32
	Batch BatchRange
}

// Key is the notice's NoticeKey.
func (n Notice) Key() NoticeKey { return NoticeKey{n.Trainer.P2P, n.Step, n.Batch} }

// IsNotice reports whether an encoded gossip message is a notice (else it
// is an announcement, or nothing valid).
func IsNotice(b []byte) bool { return len(b) > 0 && b[0] == noticeKind }

// Check validates a notice's structure, before any signature or run check.
func (n *Notice) Check() error {
	if len(n.RunID) > coordinator.MaxRunIDLen {
		return fmt.Errorf("%w: run id of %d bytes", ErrMalformed, len(n.RunID))
	}
	if n.Batch.End < n.Batch.Start {
		return fmt.Errorf("%w: batch [%d, %d)", ErrMalformed, n.Batch.Start, n.Batch.End)
	}
	return nil
}

// signedBytes encodes everything but the signature.
func (n *Notice) signedBytes() []byte {
	b := make([]byte, 0, 94+len(n.RunID)+ed25519.SignatureSize)
	b = append(b, noticeKind, byte(len(n.RunID)))
	b = append(b, n.RunID...)
	b = binary.LittleEndian.AppendUint32(b, n.Step)
	b = binary.LittleEndian.AppendUint64(b, n.Batch.Start)
	b = binary.LittleEndian.AppendUint64(b, n.Batch.End)
	b = append(b, n.Trainer.Signer[:]...)
	b = append(b, n.Trainer.P2P[:]...)
	return binary.LittleEndian.AppendUint64(b, n.Nonce)
}

func noticeSigningMessage(signed []byte) []byte {
	return append(append(make([]byte, 0, len(noticeDomain)+len(signed)), noticeDomain...), signed...)
}

// Sign sets n.Trainer.P2P to key's public key and signs n with it.
func (n *Notice) Sign(key ed25519.PrivateKey) error {
	copy(n.Trainer.P2P[:], key.Public().(ed25519.PublicKey))
	if err := n.Check(); err != nil {
		return err
	}
	copy(n.Signature[:], ed25519.Sign(key, noticeSigningMessage(n.signedBytes())))
	return nil
}

// Verify checks the signature against the notice's own p2p key. Whether
// that key belongs to the assigned trainer is the validator's question, as
// for announcements.
func (n *Notice) Verify() error {
	if err := n.Check(); err != nil {
		return err
	}
	if !ed25519.Verify(n.Trainer.P2P[:], noticeSigningMessage(n.signedBytes()), n.Signature[:]) {
		return ErrBadSignature
	}
	return nil
}

// MarshalBinary encodes n. It does not sign.
func (n *Notice) MarshalBinary() ([]byte, error) {
	if err := n.Check(); err != nil {
		return nil, err
	}
	return append(n.signedBytes(), n.Signature[:]...), nil
}

// DecodeNotice parses bytes from the network. It checks structure (kind,
// lengths, batch range) but not the signature.
func DecodeNotice(b []byte) (Notice, error) {
	var n Notice
	if len(b) > MaxNoticeSize {
		return n, fmt.Errorf("%w: notice of %d bytes", ErrOversize, len(b))
	}
	r := reader{b: b}
	if k := r.u8(); r.err == nil && k != noticeKind {
		return n, fmt.Errorf("%w: message kind %d is not a notice", ErrVersion, k)
	}
	l := int(r.u8())
	if l > coordinator.MaxRunIDLen {
		return n, fmt.Errorf("%w: run id of %d bytes", ErrMalformed, l)
	}
	n.RunID = string(r.bytes(l))
	n.Step = r.u32()
	n.Batch.Start = r.u64()
	n.Batch.End = r.u64()
	copy(n.Trainer.Signer[:], r.bytes(32))
	copy(n.Trainer.P2P[:], r.bytes(32))
	n.Nonce = r.u64()
	copy(n.Signature[:], r.bytes(ed25519.SignatureSize))
	if err := r.done(); err != nil {
		return Notice{}, err
	}
	if err := n.Check(); err != nil {
		return Notice{}, err
	}
	return n, nil
}
