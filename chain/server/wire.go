package server

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
)

// A request is one signed instruction. Wire format (little-endian):
//
//	offset  size  field
//	0       4     magic "PSRQ"
//	4       1     version (RequestVersion)
//	5       1     signature count, 1 or 2 (sender, then an optional co-signer)
//	6       2     reserved, 0
//	8       32    run id, zero-padded
//	40      8     sequence: strictly increasing per sender and run (replay protection)
//	48      4     instruction length n (≤ MaxInstruction)
//	52      n     instruction data (coordinator.EncodeInstruction)
//	52+n    96×c  signatures: public key (32) then ed25519 signature (64) over bytes [0, 52+n)
//
// Clients pick the sequence as the current time in nanoseconds (or one more
// than the last used), so a restarted client needs no state.

const (
	RequestVersion = 1
	MaxInstruction = 4096
	requestMagic   = "PSRQ"
	headerSize     = 52
	sigSize        = 32 + 64
)

var (
	ErrBadRequest = errors.New("server: malformed request")
	ErrSignature  = errors.New("server: bad signature")
	ErrReplay     = errors.New("server: sequence number already used (replayed or out of order)")
)

// Request is a decoded, signature-checked request.
type Request struct {
	RunID    [coordinator.MaxRunIDLen]byte
	Sequence uint64
	Data     []byte // instruction data
	Sender   coordinator.Pubkey
	CoSigner coordinator.Pubkey // zero if absent
}

// EncodeRequest builds and signs a request.
func EncodeRequest(runID [coordinator.MaxRunIDLen]byte, seq uint64, data []byte, signer, coSigner chain.Signer) ([]byte, error) {
	if len(data) > MaxInstruction {
		return nil, fmt.Errorf("%w: instruction is %d bytes", ErrBadRequest, len(data))
	}
	n := byte(1)
	if coSigner != nil {
		n = 2
	}
	b := make([]byte, 0, headerSize+len(data)+int(n)*sigSize)
	b = append(b, requestMagic...)
	b = append(b, RequestVersion, n, 0, 0)
	b = append(b, runID[:]...)
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	b = append(b, data...)
	msg := b[:len(b):len(b)]
	for _, s := range []chain.Signer{signer, coSigner}[:n] {
		pub := s.Public()
		b = append(b, pub[:]...)
		b = append(b, s.Sign(msg)...)
	}
	return b, nil
}

// DecodeRequest parses a request and verifies every signature.
func DecodeRequest(b []byte) (*Request, error) {
	if len(b) < headerSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadRequest, len(b))
	}
	if string(b[:4]) != requestMagic {
		return nil, fmt.Errorf("%w: bad magic", ErrBadRequest)
	}
	if b[4] != RequestVersion {
		return nil, fmt.Errorf("%w: version %d, this server reads %d", ErrBadRequest, b[4], RequestVersion)
	}
	nsig := int(b[5])
	if nsig < 1 || nsig > 2 || b[6] != 0 || b[7] != 0 {
		return nil, fmt.Errorf("%w: %d signatures or reserved bytes set", ErrBadRequest, nsig)
	}
	r := &Request{Sequence: binary.LittleEndian.Uint64(b[40:])}
	copy(r.RunID[:], b[8:40])
	n := binary.LittleEndian.Uint32(b[48:])
	if n > MaxInstruction {
		return nil, fmt.Errorf("%w: instruction of %d bytes", ErrBadRequest, n)
	}
	end := headerSize + int(n)
	if len(b) != end+nsig*sigSize {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrBadRequest, len(b), end+nsig*sigSize)
	}
	r.Data = b[headerSize:end]
	msg := b[:end]
	for i := 0; i < nsig; i++ {
		s := b[end+i*sigSize:]
		var pub coordinator.Pubkey
		copy(pub[:], s[:32])
		if !chain.Verify(pub, msg, s[32:sigSize]) {
			return nil, fmt.Errorf("%w: signature %d", ErrSignature, i)
		}
		if i == 0 {
			r.Sender = pub
		} else {
			r.CoSigner = pub
		}
	}
	return r, nil
}

// P2PInfo is the answer to GET /v1/p2p: the server's libp2p host, which
// trainers bootstrap their run's DHT from (and use as a relay if Relay).
type P2PInfo struct {
	Addrs []string `json:"addrs"` // multiaddrs ending in /p2p/<id>
	Relay bool     `json:"relay"`
}
