package secagg

import "fmt"

// The plaintext inside a Ciphertext: one client's shares for another.
// Wire format, sharePairSize bytes:
//
//	offset  size  field
//	0       1     from (ID)
//	1       1     to (ID)
//	2       32    share of the sender's self-mask seed b
//	34      32    share of the sender's s private key

const sharePairSize = 66

type sharePair struct {
	From, To ID
	B, S     [32]byte
}

func encodeSharePair(p *sharePair) []byte {
	b := make([]byte, 0, sharePairSize)
	b = append(b, byte(p.From), byte(p.To))
	b = append(b, p.B[:]...)
	return append(b, p.S[:]...)
}

func decodeSharePair(b []byte) (*sharePair, error) {
	if len(b) != sharePairSize {
		return nil, fmt.Errorf("%w: share of %d bytes, want %d", ErrMismatch, len(b), sharePairSize)
	}
	p := &sharePair{From: ID(b[0]), To: ID(b[1])}
	if p.From == 0 || p.To == 0 || p.From == p.To {
		return nil, fmt.Errorf("%w: share from %d to %d", ErrMismatch, p.From, p.To)
	}
	copy(p.B[:], b[2:34])
	copy(p.S[:], b[34:66])
	return p, nil
}
