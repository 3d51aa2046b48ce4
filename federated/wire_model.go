package federated

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The model a server serves (GET .../federated/model). Wire format
// (little-endian):
//
//	offset  size  field
//	0       4     magic "PSFM"
//	4       1     version (ModelVersion)
//	5       3     reserved, 0
//	8       8     round
//	16      4     count n (1..MaxParams)
//	20      4n    parameters, float32

const (
	ModelVersion    = 1
	modelMagic      = "PSFM"
	modelHeaderSize = 20
	// MaxModel is the largest model message.
	MaxModel = modelHeaderSize + 4*MaxParams
)

// EncodeModel builds a model message.
func EncodeModel(round uint64, params []float32) []byte {
	b := make([]byte, 0, modelHeaderSize+4*len(params))
	b = append(b, modelMagic...)
	b = append(b, ModelVersion, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, round)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(params)))
	for _, v := range params {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// DecodeModel parses a model message.
func DecodeModel(b []byte) (round uint64, params []float32, err error) {
	if len(b) < modelHeaderSize || string(b[:4]) != modelMagic || b[4] != ModelVersion || b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return 0, nil, fmt.Errorf("%w: not a version %d model message", ErrMalformed, ModelVersion)
	}
	n := binary.LittleEndian.Uint32(b[16:])
	if n < 1 || n > MaxParams || len(b) != modelHeaderSize+4*int(n) {
		return 0, nil, fmt.Errorf("%w: model message of %d bytes holding %d values", ErrMalformed, len(b), n)
	}
	params = make([]float32, n)
	for i := range params {
		params[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[modelHeaderSize+4*i:]))
	}
	return binary.LittleEndian.Uint64(b[8:]), params, nil
}
