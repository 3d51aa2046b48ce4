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
//	12      1     encoding: 0 dense float32, 1 a DisTrO frame (the run's
//	              optimizer is distro); secure aggregation has its own
//	              messages (federated/secagg)
//	13      3     reserved, 0
//	16      4     dense: count n (1..MaxParams); DisTrO: frame length m (1..4·MaxParams)
//	20      4n    dense: values, float32
//	20      m     DisTrO: the frame (distro's wire format: the top-k DCT
//	              coefficients of the client's update, decoded under the
//	              run's own limits)

const updateHeaderSize = 20

// UpdatePayload is a decoded update: Delta (dense) or Frame (DisTrO).
type UpdatePayload struct {
	Base  uint64
	Steps uint32
	Delta []float32
	Frame []byte
}

// EncodeUpdate builds an update payload.
func EncodeUpdate(u *UpdatePayload) []byte {
	b := make([]byte, updateHeaderSize, updateHeaderSize+4*len(u.Delta)+len(u.Frame))
	binary.LittleEndian.PutUint64(b, u.Base)
	binary.LittleEndian.PutUint32(b[8:], u.Steps)
	if u.Frame != nil {
		b[12] = 1
		binary.LittleEndian.PutUint32(b[16:], uint32(len(u.Frame)))
		return append(b, u.Frame...)
	}
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
	if b[12] > 1 {
		return nil, fmt.Errorf("%w: encoding %d", ErrEncoding, b[12])
	}
	if b[13] != 0 || b[14] != 0 || b[15] != 0 {
		return nil, fmt.Errorf("%w: reserved bytes set", ErrMalformed)
	}
	n := binary.LittleEndian.Uint32(b[16:])
	if b[12] == 1 {
		if n < 1 || n > 4*MaxParams || len(b) != updateHeaderSize+int(n) {
			return nil, fmt.Errorf("%w: update of %d bytes holding a frame of %d", ErrMalformed, len(b), n)
		}
		return &UpdatePayload{Base: binary.LittleEndian.Uint64(b), Steps: binary.LittleEndian.Uint32(b[8:]),
			Frame: append([]byte(nil), b[updateHeaderSize:]...)}, nil
	}
	if n < 1 || n > MaxParams || len(b) != updateHeaderSize+4*int(n) {
		return nil, fmt.Errorf("%w: update of %d bytes holding %d values", ErrMalformed, len(b), n)
	}
	u := &UpdatePayload{Base: binary.LittleEndian.Uint64(b), Steps: binary.LittleEndian.Uint32(b[8:]), Delta: make([]float32, n)}
	for i := range u.Delta {
		u.Delta[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[updateHeaderSize+4*i:]))
	}
	return u, nil
}
