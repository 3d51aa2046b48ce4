package federated

import (
	"encoding/binary"
	"fmt"
	"math"
)

// An update payload (a request of KindUpdate) is a client's model delta.
// Wire format (little-endian):
//
//	offset  size  field
//	0       8     base round: the round of the model the client trained
//	8       4     local steps trained (1..MaxRoundDuration)
//	12      1     encoding: 0 dense float32 (the only one the buffer takes;
//	              secure aggregation has its own messages, federated/secagg)
//	13      3     reserved, 0
//	16      4     count n (1..MaxParams)
//	20      4n    values, float32

const updateHeaderSize = 20

// UpdatePayload is a decoded update.
type UpdatePayload struct {
	Base  uint64
	Steps uint32
	Delta []float32
}

// EncodeUpdate builds an update payload.
func EncodeUpdate(u *UpdatePayload) []byte {
	b := make([]byte, updateHeaderSize, updateHeaderSize+4*len(u.Delta))
	binary.LittleEndian.PutUint64(b, u.Base)
	binary.LittleEndian.PutUint32(b[8:], u.Steps)
	binary.LittleEndian.PutUint32(b[16:], uint32(len(u.Delta)))
	for _, v := range u.Delta {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// DecodeUpdate parses an update payload.
func DecodeUpdate(b []byte) (*UpdatePayload, error) {
	if len(b) < updateHeaderSize {
		return nil, fmt.Errorf("%w: update of %d bytes", ErrMalformed, len(b))
	}
	if b[12] != 0 {
		return nil, fmt.Errorf("%w: encoding %d", ErrEncoding, b[12])
	}
	if b[13] != 0 || b[14] != 0 || b[15] != 0 {
		return nil, fmt.Errorf("%w: reserved bytes set", ErrMalformed)
	}
	n := binary.LittleEndian.Uint32(b[16:])
	if n < 1 || n > MaxParams || len(b) != updateHeaderSize+4*int(n) {
		return nil, fmt.Errorf("%w: update of %d bytes holding %d values", ErrMalformed, len(b), n)
	}
	u := &UpdatePayload{Base: binary.LittleEndian.Uint64(b), Steps: binary.LittleEndian.Uint32(b[8:]), Delta: make([]float32, n)}
	for i := range u.Delta {
		u.Delta[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[updateHeaderSize+4*i:]))
	}
	return u, nil
}
