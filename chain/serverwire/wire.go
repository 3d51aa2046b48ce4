package serverwire

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
//	8       32    server identity (Binding.Server)
//	40      32    run id, zero-padded
//	72      8     run incarnation (Binding.Incarnation)
//	80      8     sequence: strictly increasing per sender and run, within the server's window of its clock
//	88      4     instruction length n (≤ MaxInstruction)
//	92      n     instruction data (coordinator.EncodeInstruction)
//	92+n    96×c  signatures: public key (32) then ed25519 signature (64) over bytes [0, 92+n)
//
// The server identity and the incarnation bind a signature to one server
// and one life of the run: a request captured before free_coordinator (or
// on another server) never applies to a run initialized again under the
// same id. init_coordinator is signed for the incarnation the run will
// have. Clients learn both, and the server's clock, from
// GET /v1/runs/{id}/binding, and pick the sequence as the server's time in
// nanoseconds (or one more than the last used), so a restarted client needs
// no state and a client whose clock is off still signs fresh requests.

const (
	RequestVersion = 2
	MaxInstruction = 4096
	// HeaderSize is the bytes before a request's instruction data.
	HeaderSize   = 92
	requestMagic = "PSRQ"
	sigSize      = 32 + 64
)

var (
	ErrBadRequest = errors.New("server: malformed request")
	ErrSignature  = errors.New("server: bad signature")
	ErrReplay     = errors.New("server: sequence number already used (replayed or out of order)")
	// ErrStale is a request signed for another server, another life of
	// the run, or outside the server's window of time: the client fetches
	// the binding again and signs anew.
	ErrStale = errors.New("server: request signed for another server, run incarnation or time")
)

// Binding is what a request is signed for besides its instruction: the
// server, the run's incarnation, and (for choosing sequence numbers) the
// server's clock and the lowest sequence a signer without an entry may use.
type Binding struct {
	Server      [32]byte
	Incarnation uint64
	Floor       uint64 // a fresh signer's sequence must exceed it
	Now         uint64 // the server's clock, unix nanoseconds, when asked
}

// Request is a decoded, signature-checked request.
type Request struct {
	Server      [32]byte
	RunID       [coordinator.MaxRunIDLen]byte
	Incarnation uint64
	Sequence    uint64
	Data        []byte // instruction data
	Sender      coordinator.Pubkey
	CoSigner    coordinator.Pubkey // zero if absent
}

// EncodeRequest builds and signs a request for the run runID of the server
// and incarnation that b names.
func EncodeRequest(b Binding, runID [coordinator.MaxRunIDLen]byte, seq uint64, data []byte, signer, coSigner chain.Signer) ([]byte, error) {
	if len(data) > MaxInstruction {
		return nil, fmt.Errorf("%w: instruction is %d bytes", ErrBadRequest, len(data))
	}
	n := byte(1)
	if coSigner != nil {
		n = 2
	}
	out := make([]byte, 0, HeaderSize+len(data)+int(n)*sigSize)
	out = append(out, requestMagic...)
	out = append(out, RequestVersion, n, 0, 0)
	out = append(out, b.Server[:]...)
	out = append(out, runID[:]...)
	out = binary.LittleEndian.AppendUint64(out, b.Incarnation)
	out = binary.LittleEndian.AppendUint64(out, seq)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(data)))
	out = append(out, data...)
	msg := out[:len(out):len(out)]
	for _, s := range []chain.Signer{signer, coSigner}[:n] {
		pub := s.Public()
		out = append(out, pub[:]...)
		out = append(out, s.Sign(msg)...)
	}
	return out, nil
}

// DecodeRequest parses a request and verifies every signature.
func DecodeRequest(b []byte) (*Request, error) {
	if len(b) < HeaderSize {
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
	r := &Request{Incarnation: binary.LittleEndian.Uint64(b[72:]), Sequence: binary.LittleEndian.Uint64(b[80:])}
	copy(r.Server[:], b[8:40])
	copy(r.RunID[:], b[40:72])
	n := binary.LittleEndian.Uint32(b[88:])
	if n > MaxInstruction {
		return nil, fmt.Errorf("%w: instruction of %d bytes", ErrBadRequest, n)
	}
	end := HeaderSize + int(n)
	if len(b) != end+nsig*sigSize {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrBadRequest, len(b), end+nsig*sigSize)
	}
	r.Data = b[HeaderSize:end]
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

// BindingInfo is the answer to GET /v1/runs/{id}/binding (JSON).
type BindingInfo struct {
	Server      string `json:"server"`      // hex of the server identity
	Incarnation uint64 `json:"incarnation"` // the live run's, or the next init's
	Floor       uint64 `json:"floor"`
	Now         uint64 `json:"now"` // unix nanoseconds
}

// P2PInfo is the answer to GET /v1/p2p: the server's libp2p host, which
// trainers bootstrap their run's DHT from (and use as a relay if Relay).
type P2PInfo struct {
	Addrs []string `json:"addrs"` // multiaddrs ending in /p2p/<id>
	Relay bool     `json:"relay"`
}
