package data

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/psyche-go/psyche/internal/atomicfile"
)

// Token sizes a token file may use: bytes per token.
const (
	TokenSize16 = 2 // u16 tokens: vocabularies up to 65,536
	TokenSize32 = 4 // u32 tokens
)

// writeChunkTokens is how many tokens WriteTokenFile encodes per write, so
// that a large file needs only a small buffer and ctx is checked regularly.
const writeChunkTokens = 1 << 16

func checkTokenSize(tokenSize int) error {
	if tokenSize != TokenSize16 && tokenSize != TokenSize32 {
		return fmt.Errorf("data: token size must be %d or %d bytes, got %d", TokenSize16, TokenSize32, tokenSize)
	}
	return nil
}

// maxToken is the largest token a width can hold.
func maxToken(tokenSize int) uint32 {
	if tokenSize == TokenSize16 {
		return math.MaxUint16
	}
	return math.MaxUint32
}

// checkTokens reports the first token that does not fit tokenSize bytes.
func checkTokens(tokens []uint32, tokenSize int) error {
	limit := maxToken(tokenSize)
	for i, t := range tokens {
		if t > limit {
			return fmt.Errorf("%w: token %d at position %d does not fit in %d bytes", ErrTokenRange, t, i, tokenSize)
		}
	}
	return nil
}

// EncodeTokens appends tokens to dst as little-endian integers of tokenSize
// bytes each and returns the extended slice. A token that does not fit the
// width fails with ErrTokenRange and leaves dst's contents unchanged.
func EncodeTokens(dst []byte, tokens []uint32, tokenSize int) ([]byte, error) {
	if err := checkTokenSize(tokenSize); err != nil {
		return dst, err
	}
	if err := checkTokens(tokens, tokenSize); err != nil {
		return dst, err
	}
	return appendEncoded(dst, tokens, tokenSize), nil
}

// appendEncoded is EncodeTokens without the checks.
func appendEncoded(dst []byte, tokens []uint32, tokenSize int) []byte {
	if tokenSize == TokenSize16 {
		for _, t := range tokens {
			dst = binary.LittleEndian.AppendUint16(dst, uint16(t))
		}
		return dst
	}
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}

// DecodeTokens appends the tokens encoded in b (little-endian integers of
// tokenSize bytes each) to dst and returns the extended slice. A length that
// is not a multiple of tokenSize fails with ErrMisaligned.
func DecodeTokens(dst []uint32, b []byte, tokenSize int) ([]uint32, error) {
	if err := checkTokenSize(tokenSize); err != nil {
		return dst, err
	}
	if len(b)%tokenSize != 0 {
		return dst, fmt.Errorf("%w: %d bytes with %d-byte tokens", ErrMisaligned, len(b), tokenSize)
	}
	return decodeInto(grow(dst, len(b)/tokenSize), b, tokenSize), nil
}

// grow returns dst extended by n elements, reallocating only when its
// capacity is too small.
func grow(dst []uint32, n int) []uint32 {
	if cap(dst)-len(dst) < n {
		bigger := make([]uint32, len(dst), len(dst)+n)
		copy(bigger, dst)
		dst = bigger
	}
	return dst[:len(dst)+n]
}

// decodeInto decodes b into the last len(b)/tokenSize elements of dst.
func decodeInto(dst []uint32, b []byte, tokenSize int) []uint32 {
	out := dst[len(dst)-len(b)/tokenSize:]
	if tokenSize == TokenSize16 {
		for i := range out {
			out[i] = uint32(binary.LittleEndian.Uint16(b[2*i:]))
		}
		return dst
	}
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return dst
}

// WriteTokenFile writes tokens to path as a token file of tokenSize-byte
// tokens, replacing any file there atomically: the tokens go to a temporary
// file in the same directory, which is synced and then renamed over path. A
// crash or an error (including ctx ending) leaves either the old file or the
// complete new one, never a partial file. Every token is checked before
// anything is written.
func WriteTokenFile(ctx context.Context, path string, tokens []uint32, tokenSize int) (err error) {
	if err := checkTokenSize(tokenSize); err != nil {
		return err
	}
	if err := checkTokens(tokens, tokenSize); err != nil {
		return wrapf(err, "write %s", path)
	}
	if err := ctx.Err(); err != nil {
		return wrapf(err, "write %s", path)
	}
	err = atomicfile.Write(ctx, path, 0o644, func(w io.Writer) error {
		buf := make([]byte, 0, min(len(tokens), writeChunkTokens)*tokenSize)
		for start := 0; start < len(tokens); start += writeChunkTokens {
			if err := ctx.Err(); err != nil {
				return err
			}
			chunk := tokens[start:min(start+writeChunkTokens, len(tokens))]
			if _, err := w.Write(appendEncoded(buf[:0], chunk, tokenSize)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return wrapf(err, "write %s", path)
	}
	return nil
}

// ReadTokenFile reads a whole local token file of tokenSize-byte tokens.
func ReadTokenFile(ctx context.Context, path string, tokenSize int) ([]uint32, error) {
	if err := checkTokenSize(tokenSize); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, wrapf(err, "read %s", path)
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		return nil, wrapf(err, "read %s", path)
	}
	tokens, err := DecodeTokens(nil, b, tokenSize)
	if err != nil {
		return nil, wrapf(err, "read %s", path)
	}
	return tokens, nil
}
