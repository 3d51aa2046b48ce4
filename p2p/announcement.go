package p2p

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
)

// The signed announcement: the one message on a run's gossip topic. It is
// small on purpose (gossip caps messages at 1 MiB and every node relays every
// message); the payload itself moves over bitswap, named by Blob.
//
// Encoding version 2 (version 1 named blocks by sha2-256; see BlockDigest),
// all integers little-endian:
//
//	offset      size   field
//	0           1      version (2)
//	1           1      run id length L (≤ 32)
//	2           L      run id
//	2+L         4      step
//	6+L         8      batch start (first data index)
//	14+L        8      batch end (one past the last data index)
//	22+L        32     trainer signer key
//	54+L        32     trainer p2p key (ed25519, signs this message)
//	86+L        32     commitment
//	118+L       8      payload size in bytes
//	126+L       2      block count K (= ceil(size / BlockSize))
//	128+L       32·K   BlockDigest of each raw block, in payload order
//	128+L+32K   8      nonce
//	136+L+32K   64     ed25519 signature over "psyche/announcement/v1" ‖ bytes [0, 136+L+32K)
//
// The nonce makes every re-announcement a distinct message (gossipsub drops
// duplicates by id, so an identical re-send would never reach a peer that
// missed the first), while the signature makes a copy replayed by someone
// else recognisable as one.

const (
	announcementVersion = 2
	// BlockSize is the largest raw block moved by bitswap. Payloads are cut
	// into blocks of exactly this size (the last one shorter).
	BlockSize = 1 << 20
	// MaxBlobBlocks bounds a payload at 1 GiB and an announcement at ~33 KiB.
	MaxBlobBlocks = 1024
	// MaxAnnouncementSize is the largest encoded announcement accepted from
	// the network; the topic validator rejects anything larger unread.
	MaxAnnouncementSize = 2 + coordinator.MaxRunIDLen + 126 + 32*MaxBlobBlocks + 8 + ed25519.SignatureSize
)

var announcementDomain = []byte("psyche/announcement/v1")

// BatchRange is a half-open range of data indices [Start, End).
type BatchRange struct {
	Start, End uint64
}

// BlobRef names a payload stored as raw CIDv1 BLAKE3 blocks: its size and
// the digest of every block in order.
type BlobRef struct {
	Size   uint64
	Blocks []coordinator.Hash
}

// Announcement says that Trainer has a result for Batch at Step, committed to
// by Commitment and fetchable as Blob.
type Announcement struct {
	RunID      string
	Step       uint32
	Batch      BatchRange
	Trainer    coordinator.ClientID
	Commitment coordinator.Hash
	Blob       BlobRef
	Nonce      uint64
	Signature  [ed25519.SignatureSize]byte
}

// Commitment binds a result to its step and batch: CommitmentOf the
// payload's blocks.
func Commitment(step uint32, batch BatchRange, payload []byte) coordinator.Hash {
	return CommitmentOf(step, batch, BlobRef{Size: uint64(len(payload)), Blocks: BlockDigests(payload)})
}

// CommitmentOf is the commitment of a payload given its blocks: sha256 over
// a domain tag, le32(step), le64(batch start), le64(batch end), le64(payload
// size) and the digest of each block in order (BlockDigests). Witnesses put
// it in their broadcast bloom, so it must be the same on every node.
//
// It covers the block digests rather than the payload itself: the digests
// bind the payload as firmly, and a fetcher that checks every block against
// the announced list as it arrives then checks the commitment from the list
// alone (before fetching anything), one pass over the bytes instead of two;
// the publisher too hashes its payload once.
func CommitmentOf(step uint32, batch BatchRange, ref BlobRef) coordinator.Hash {
	h := sha256.New()
	var b [4 + 8 + 8 + 8]byte
	binary.LittleEndian.PutUint32(b[0:], step)
	binary.LittleEndian.PutUint64(b[4:], batch.Start)
	binary.LittleEndian.PutUint64(b[12:], batch.End)
	binary.LittleEndian.PutUint64(b[20:], ref.Size)
	h.Write([]byte("psyche/commitment/v3"))
	h.Write(b[:])
	for _, d := range ref.Blocks {
		h.Write(d[:])
	}
	var out coordinator.Hash
	h.Sum(out[:0])
	return out
}

// BlockDigests cuts data into blocks of BlockSize bytes (the last may be
// shorter) and returns each block's digest: a BlobRef's Blocks.
func BlockDigests(data []byte) []coordinator.Hash {
	var hs []coordinator.Hash
	for off := 0; off < len(data); off += BlockSize {
		hs = append(hs, BlockDigest(data[off:min(off+BlockSize, len(data))]))
	}
	return hs
}

// blocksFor returns how many blocks a payload of size bytes occupies.
func blocksFor(size uint64) uint64 { return (size + BlockSize - 1) / BlockSize }

// Check validates an announcement's structure (sizes, block counts, batch
// range), before any signature or run check.
func (a *Announcement) Check() error {
	if len(a.RunID) > coordinator.MaxRunIDLen {
		return fmt.Errorf("%w: run id of %d bytes", ErrMalformed, len(a.RunID))
	}
	if a.Batch.End < a.Batch.Start {
		return fmt.Errorf("%w: batch [%d, %d)", ErrMalformed, a.Batch.Start, a.Batch.End)
	}
	if len(a.Blob.Blocks) > MaxBlobBlocks {
		return fmt.Errorf("%w: %d blocks", ErrOversize, len(a.Blob.Blocks))
	}
	if uint64(len(a.Blob.Blocks)) != blocksFor(a.Blob.Size) {
		return fmt.Errorf("%w: %d blocks for %d bytes", ErrMalformed, len(a.Blob.Blocks), a.Blob.Size)
	}
	// A block listed twice would be fetched once and counted twice: an
	// announcement could declare a large blob backed by one block.
	seen := make(map[coordinator.Hash]struct{}, len(a.Blob.Blocks))
	for _, h := range a.Blob.Blocks {
		if _, dup := seen[h]; dup {
			return fmt.Errorf("%w: block %x listed twice", ErrMalformed, h[:8])
		}
		seen[h] = struct{}{}
	}
	return nil
}

// CheckSize refuses a blob larger than max bytes (the largest result the
// run's model can produce), before anything is fetched or allocated.
func (a *Announcement) CheckSize(max int64) error {
	if max > 0 && a.Blob.Size > uint64(max) {
		return fmt.Errorf("%w: a %d-byte result, this run's results have at most %d", ErrOversize, a.Blob.Size, max)
	}
	return nil
}

// BlockLen is the length block i of a blob of size bytes must have: BlockSize,
// except the last, which holds the rest.
func BlockLen(size uint64, i int) int {
	if rest := size - uint64(i)*BlockSize; rest < BlockSize {
		return int(rest)
	}
	return BlockSize
}

// signedBytes encodes everything but the signature.
func (a *Announcement) signedBytes() []byte {
	b := make([]byte, 0, 2+len(a.RunID)+126+32*len(a.Blob.Blocks)+8+ed25519.SignatureSize)
	b = append(b, announcementVersion, byte(len(a.RunID)))
	b = append(b, a.RunID...)
	b = binary.LittleEndian.AppendUint32(b, a.Step)
	b = binary.LittleEndian.AppendUint64(b, a.Batch.Start)
	b = binary.LittleEndian.AppendUint64(b, a.Batch.End)
	b = append(b, a.Trainer.Signer[:]...)
	b = append(b, a.Trainer.P2P[:]...)
	b = append(b, a.Commitment[:]...)
	b = binary.LittleEndian.AppendUint64(b, a.Blob.Size)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(a.Blob.Blocks)))
	for _, h := range a.Blob.Blocks {
		b = append(b, h[:]...)
	}
	return binary.LittleEndian.AppendUint64(b, a.Nonce)
}

func signingMessage(signed []byte) []byte {
	return append(append(make([]byte, 0, len(announcementDomain)+len(signed)), announcementDomain...), signed...)
}

// Sign sets a.Trainer.P2P to key's public key and signs a with it.
func (a *Announcement) Sign(key ed25519.PrivateKey) error {
	copy(a.Trainer.P2P[:], key.Public().(ed25519.PublicKey))
	if err := a.Check(); err != nil {
		return err
	}
	copy(a.Signature[:], ed25519.Sign(key, signingMessage(a.signedBytes())))
	return nil
}

// Verify checks the signature against the announcement's own p2p key. Whether
// that key belongs to the assigned trainer is a separate question (see
// Network.SetAssignments).
func (a *Announcement) Verify() error {
	if err := a.Check(); err != nil {
		return err
	}
	return a.verifySignature()
}

func (a *Announcement) verifySignature() error {
	if !ed25519.Verify(a.Trainer.P2P[:], signingMessage(a.signedBytes()), a.Signature[:]) {
		return ErrBadSignature
	}
	return nil
}

// SignUnchecked signs a with key without the structural checks of Sign and
// returns its encoding: what a misbehaving trainer can send, for tests and
// the adversary build. Honest code signs with Sign.
func (a *Announcement) SignUnchecked(key ed25519.PrivateKey) []byte {
	copy(a.Trainer.P2P[:], key.Public().(ed25519.PublicKey))
	copy(a.Signature[:], ed25519.Sign(key, signingMessage(a.signedBytes())))
	return append(a.signedBytes(), a.Signature[:]...)
}

// SignedMalformed reports whether a, refused by Verify as malformed, still
// carries its trainer's signature. Such an announcement is nobody's forgery:
// its trainer signed a result no honest node publishes (a block listed
// twice, a block count that does not fit its size), so a node takes it as
// the trainer's refused result for its batch (instead of waiting for a
// result that will never come), while nobody relays it.
func (a *Announcement) SignedMalformed() bool {
	return errors.Is(a.Check(), ErrMalformed) && a.verifySignature() == nil
}

// MarshalBinary encodes a in version 1. It does not sign.
func (a *Announcement) MarshalBinary() ([]byte, error) {
	if err := a.Check(); err != nil {
		return nil, err
	}
	return append(a.signedBytes(), a.Signature[:]...), nil
}

// DecodeAnnouncement parses bytes from the network. It checks structure
// (version, lengths, block count against size) but not the signature.
func DecodeAnnouncement(b []byte) (Announcement, error) {
	a, err := parseAnnouncement(b)
	if err != nil {
		return Announcement{}, err
	}
	if err := a.Check(); err != nil {
		return Announcement{}, err
	}
	return a, nil
}

// DecodeMalformed parses bytes that DecodeAnnouncement refused as
// malformed (Check) and returns the announcement if its trainer signed it
// (see SignedMalformed); anything else is an error.
func DecodeMalformed(b []byte) (Announcement, error) {
	a, err := parseAnnouncement(b)
	if err != nil {
		return Announcement{}, err
	}
	if !a.SignedMalformed() {
		return Announcement{}, fmt.Errorf("%w: not a signed malformed announcement", ErrMalformed)
	}
	return a, nil
}

// parseAnnouncement reads the fields of an encoded announcement, with the
// limits that bound what it allocates, but not its structural rules.
func parseAnnouncement(b []byte) (Announcement, error) {
	var a Announcement
	if len(b) > MaxAnnouncementSize {
		return a, fmt.Errorf("%w: announcement of %d bytes", ErrOversize, len(b))
	}
	r := reader{b: b}
	if v := r.u8(); r.err == nil && v != announcementVersion {
		return a, fmt.Errorf("%w: announcement version %d", ErrVersion, v)
	}
	n := int(r.u8())
	if n > coordinator.MaxRunIDLen {
		return a, fmt.Errorf("%w: run id of %d bytes", ErrMalformed, n)
	}
	a.RunID = string(r.bytes(n))
	a.Step = r.u32()
	a.Batch.Start = r.u64()
	a.Batch.End = r.u64()
	copy(a.Trainer.Signer[:], r.bytes(32))
	copy(a.Trainer.P2P[:], r.bytes(32))
	copy(a.Commitment[:], r.bytes(32))
	a.Blob.Size = r.u64()
	k := int(r.u16())
	if k > MaxBlobBlocks {
		return a, fmt.Errorf("%w: %d blocks", ErrOversize, k)
	}
	if k > 0 && r.err == nil {
		a.Blob.Blocks = make([]coordinator.Hash, k)
		for i := range a.Blob.Blocks {
			copy(a.Blob.Blocks[i][:], r.bytes(32))
		}
	}
	a.Nonce = r.u64()
	copy(a.Signature[:], r.bytes(ed25519.SignatureSize))
	if err := r.done(); err != nil {
		return Announcement{}, err
	}
	return a, nil
}

// reader is a bounds-checked little-endian cursor: after the first short
// read every further read returns zero and err stays set.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil || n < 0 || len(r.b)-r.off < n {
		if r.err == nil {
			r.err = ErrShortBuffer
		}
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) u8() uint8 {
	if s := r.bytes(1); s != nil {
		return s[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if s := r.bytes(2); s != nil {
		return binary.LittleEndian.Uint16(s)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if s := r.bytes(4); s != nil {
		return binary.LittleEndian.Uint32(s)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if s := r.bytes(8); s != nil {
		return binary.LittleEndian.Uint64(s)
	}
	return 0
}

func (r *reader) done() error {
	if r.err != nil {
		return r.err
	}
	if r.off != len(r.b) {
		return fmt.Errorf("%w: %d bytes", ErrTrailingBytes, len(r.b)-r.off)
	}
	return nil
}
