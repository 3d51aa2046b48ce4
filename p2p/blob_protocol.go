package p2p

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/psyche-go/psyche/coordinator"
)

// The blob stream protocol: the fast path for a result's blocks. A fetcher
// opens one stream to the announcer and names the blocks it lacks; the
// announcer writes them back to back, and the fetcher reads each straight
// into its place in the payload and checks it against its digest before
// using or storing it. Bitswap, which asks every peer and takes each block
// from whoever has it, remains the protocol of record: a fetcher falls back
// to it for whatever the stream did not deliver (a peer that is slow, stops
// mid-blob, does not hold a block or sends a wrong one).
//
// Protocol id BlobProtocol (its /1 named blocks by sha2-256, /2 by
// BlockDigest; the bytes are the same). The requester writes one request and
// closes its write side; the responder writes one frame per requested block,
// in request order, and closes. Encoding version 1, little-endian:
//
//	request:  0 u8 version (1) | 1 u16 count K (1 ≤ K ≤ MaxBlobBlocks)
//	          | 3 K × ( 32 BlockDigest of the block | u32 length N (1 ≤ N ≤ BlockSize) )
//	response: K × ( u8 status | N block bytes when status is 1 )
//
// Status 1 (BlockHere) is followed by exactly the requested N bytes; status
// 0 (BlockNotHeld) by nothing: the responder lacks the block (or holds it
// with another length) and goes on with the next. A requester therefore
// never reads more than the lengths it asked for, and the lengths come from
// the signed announcement, never from the responder.

// BlobProtocol is the libp2p protocol id of the blob stream.
const BlobProtocol = "/psyche/blob/2"

const (
	blobVersion = 1
	// MaxBlobRequestSize is the size of the longest blob request.
	MaxBlobRequestSize = 3 + (32+4)*MaxBlobBlocks

	// BlockNotHeld and BlockHere are the status bytes of a response frame.
	BlockNotHeld = 0
	BlockHere    = 1
)

// BlockWant names one block of a blob request: its digest and the length
// the requester expects (from the announcement: BlockLen).
type BlockWant struct {
	Hash coordinator.Hash
	Len  uint32
}

// BlobRequest asks a peer for blocks, in the order it wants them streamed.
type BlobRequest struct {
	Blocks []BlockWant
}

// WantsOf lists the blocks of ref at the given indices as a request.
func WantsOf(ref BlobRef, idx []int) BlobRequest {
	r := BlobRequest{Blocks: make([]BlockWant, len(idx))}
	for k, i := range idx {
		r.Blocks[k] = BlockWant{Hash: ref.Blocks[i], Len: uint32(BlockLen(ref.Size, i))}
	}
	return r
}

func (r BlobRequest) check() error {
	if len(r.Blocks) == 0 || len(r.Blocks) > MaxBlobBlocks {
		return fmt.Errorf("%w: blob request for %d blocks", ErrMalformed, len(r.Blocks))
	}
	for i, w := range r.Blocks {
		if w.Len == 0 || w.Len > BlockSize {
			return fmt.Errorf("%w: block %d of %d bytes, at most %d", ErrMalformed, i, w.Len, BlockSize)
		}
	}
	return nil
}

// MarshalBinary encodes r in version 1.
func (r BlobRequest) MarshalBinary() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 3+36*len(r.Blocks))
	b = append(b, blobVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.Blocks)))
	for _, w := range r.Blocks {
		b = append(b, w.Hash[:]...)
		b = binary.LittleEndian.AppendUint32(b, w.Len)
	}
	return b, nil
}

// DecodeBlobRequest parses a request read from a stream.
func DecodeBlobRequest(b []byte) (BlobRequest, error) {
	var req BlobRequest
	if len(b) > MaxBlobRequestSize {
		return req, fmt.Errorf("%w: blob request of %d bytes", ErrOversize, len(b))
	}
	r := reader{b: b}
	if v := r.u8(); r.err == nil && v != blobVersion {
		return req, fmt.Errorf("%w: blob version %d", ErrVersion, v)
	}
	k := int(r.u16())
	if k > MaxBlobBlocks {
		return req, fmt.Errorf("%w: %d blocks", ErrOversize, k)
	}
	if r.err == nil && len(b)-r.off == 36*k {
		req.Blocks = make([]BlockWant, k)
		for i := range req.Blocks {
			copy(req.Blocks[i].Hash[:], r.bytes(32))
			req.Blocks[i].Len = r.u32()
		}
	} else if r.err == nil {
		r.err = fmt.Errorf("%w: %d blocks in %d bytes", ErrShortBuffer, k, len(b))
	}
	if err := r.done(); err != nil {
		return BlobRequest{}, err
	}
	if err := req.check(); err != nil {
		return BlobRequest{}, err
	}
	return req, nil
}

// WriteBlobBlock writes one response frame: data (BlockHere) or, when
// data is nil, BlockNotHeld.
func WriteBlobBlock(w io.Writer, data []byte) error {
	if data == nil {
		_, err := w.Write([]byte{BlockNotHeld})
		return err
	}
	if _, err := w.Write([]byte{BlockHere}); err != nil {
		return err
	}
	_, err := w.Write(data)
	return err
}

// ReadBlobBlock reads the response frame for want into dst[:want.Len]
// (dst must be that long). It returns false when the responder does not
// hold the block. The bytes are not checked yet: call VerifyBlock before
// using or storing them (it is separate so that a fetcher can hash one block
// while reading the next).
func ReadBlobBlock(r io.Reader, want BlockWant, dst []byte) (held bool, err error) {
	var st [1]byte
	if _, err := io.ReadFull(r, st[:]); err != nil {
		return false, err
	}
	switch st[0] {
	case BlockNotHeld:
		return false, nil
	case BlockHere:
	default:
		return false, fmt.Errorf("%w: blob status %d", ErrMalformed, st[0])
	}
	if len(dst) < int(want.Len) {
		return false, fmt.Errorf("%w: a %d-byte buffer for a %d-byte block", ErrShortBuffer, len(dst), want.Len)
	}
	if _, err := io.ReadFull(r, dst[:want.Len]); err != nil {
		return false, err
	}
	return true, nil
}

// VerifyBlock checks that data is the block want names: its length and its
// digest (BlockDigest).
func VerifyBlock(want BlockWant, data []byte) error {
	if len(data) != int(want.Len) {
		return fmt.Errorf("%w: %d bytes, want %d", ErrBlockMismatch, len(data), want.Len)
	}
	if BlockDigest(data) != want.Hash {
		return fmt.Errorf("%w: %x", ErrBlockMismatch, want.Hash[:8])
	}
	return nil
}
