package federated

import (
	"crypto/ed25519"
	"encoding/binary"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
)

// A request is one signed message to a run's federated service. Wire
// format (little-endian), in the manner of the server's instruction
// requests:
//
//	offset  size  field
//	0       4     magic "PSFR"
//	4       1     version (RequestVersion)
//	5       1     kind: 1 update (wire_update.go), 2 config (wire_config.go), 3-6 a secure
//	              aggregation round's advertise, shares, masked input and reveal
//	              (federated/secagg's wire_messages.go), 7 join (wire_join.go)
//	6       2     reserved, 0
//	8       32    run id, zero-padded
//	40      8     sequence: strictly increasing per signer and run (replay protection)
//	48      4     payload length n (≤ MaxPayload)
//	52      n     payload
//	52+n    32    signer's ed25519 public key
//	84+n    64    signature over bytes [0, 52+n)

const (
	RequestVersion    = 1
	requestMagic      = "PSFR"
	requestHeaderSize = 52
	requestSigSize    = 32 + 64
	// MaxPayload is the largest payload: a dense update of MaxParams values.
	MaxPayload = updateHeaderSize + 4*MaxParams
	// MaxRequest is the largest request, the HTTP body limit.
	MaxRequest = requestHeaderSize + MaxPayload + requestSigSize
)

// Kind is what a request carries.
type Kind uint8

const (
	KindUpdate          Kind = 1
	KindConfig          Kind = 2
	KindSecAggAdvertise Kind = 3
	KindSecAggShares    Kind = 4
	KindSecAggMasked    Kind = 5
	KindSecAggReveal    Kind = 6
	KindJoin            Kind = 7
)

// Signer signs requests (chain.Keypair is one).
type Signer interface {
	Public() coordinator.Pubkey
	Sign(msg []byte) []byte
}

// Request is a decoded, signature-checked request.
type Request struct {
	Kind     Kind
	RunID    [coordinator.MaxRunIDLen]byte
	Sequence uint64
	Payload  []byte
	Signer   coordinator.Pubkey
}

// EncodeRequest builds and signs a request.
func EncodeRequest(kind Kind, runID string, seq uint64, payload []byte, s Signer) ([]byte, error) {
	var id [coordinator.MaxRunIDLen]byte
	if err := coordinator.SetFixedString(id[:], runID); err != nil {
		return nil, fmt.Errorf("%w: run id %q", ErrMalformed, runID)
	}
	if len(payload) > MaxPayload {
		return nil, fmt.Errorf("%w: payload of %d bytes (at most %d)", ErrMalformed, len(payload), MaxPayload)
	}
	b := make([]byte, 0, requestHeaderSize+len(payload)+requestSigSize)
	b = append(b, requestMagic...)
	b = append(b, RequestVersion, byte(kind), 0, 0)
	b = append(b, id[:]...)
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	msg := b[:len(b):len(b)]
	pub := s.Public()
	b = append(b, pub[:]...)
	return append(b, s.Sign(msg)...), nil
}

// RequestHeaderSize is the size of a request's header: what a server reads
// first (PeekRequest) to know the run and the payload's size before it
// reads, or allocates for, the rest.
const RequestHeaderSize = requestHeaderSize

// RequestHead is what a request's header says, unverified: the signature
// covers it, but is checked only once the whole request is read.
type RequestHead struct {
	Kind       Kind
	RunID      string
	PayloadLen int
}

// Rest is how many bytes follow the header: the payload and the signature.
func (h RequestHead) Rest() int { return h.PayloadLen + requestSigSize }

// PeekRequest reads a request's header (its first RequestHeaderSize bytes).
func PeekRequest(b []byte) (RequestHead, error) {
	if len(b) < requestHeaderSize {
		return RequestHead{}, fmt.Errorf("%w: request of %d bytes", ErrMalformed, len(b))
	}
	if string(b[:4]) != requestMagic || b[4] != RequestVersion || b[6] != 0 || b[7] != 0 {
		return RequestHead{}, fmt.Errorf("%w: not a version %d request", ErrMalformed, RequestVersion)
	}
	h := RequestHead{Kind: Kind(b[5]), RunID: coordinator.FixedString(b[8:40])}
	if h.Kind < KindUpdate || h.Kind > KindJoin {
		return RequestHead{}, fmt.Errorf("%w: request kind %d", ErrMalformed, h.Kind)
	}
	n := binary.LittleEndian.Uint32(b[48:])
	if n > MaxPayload {
		return RequestHead{}, fmt.Errorf("%w: payload of %d bytes (at most %d)", ErrMalformed, n, MaxPayload)
	}
	h.PayloadLen = int(n)
	return h, nil
}

// MaxPayloadFor is the largest payload a request of kind may carry to a run
// whose model has params values: a config's size; otherwise a dense update
// or masked input of the model (4 bytes a value) and the largest secure
// aggregation message of a round (255 clients' shares) beside it.
func MaxPayloadFor(kind Kind, params int) int {
	switch kind {
	case KindConfig:
		return ConfigSize
	case KindJoin:
		return JoinTokenSize
	}
	return 64<<10 + 4*params
}

// DecodeRequest parses a request and verifies its signature.
func DecodeRequest(b []byte) (*Request, error) {
	if len(b) < requestHeaderSize+requestSigSize {
		return nil, fmt.Errorf("%w: request of %d bytes", ErrMalformed, len(b))
	}
	h, err := PeekRequest(b)
	if err != nil {
		return nil, err
	}
	r := &Request{Kind: h.Kind, Sequence: binary.LittleEndian.Uint64(b[40:])}
	copy(r.RunID[:], b[8:40])
	end := requestHeaderSize + h.PayloadLen
	if len(b) != end+requestSigSize {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrMalformed, len(b), end+requestSigSize)
	}
	copy(r.Signer[:], b[end:end+32])
	if !ed25519.Verify(r.Signer[:], b[:end], b[end+32:]) {
		return nil, ErrSignature
	}
	r.Payload = b[requestHeaderSize:end]
	return r, nil
}

// RunIDString is the request's run id as text.
func (r *Request) RunIDString() string { return coordinator.FixedString(r.RunID[:]) }
