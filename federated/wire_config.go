package federated

import (
	"encoding/binary"
	"fmt"
	"math"
)

// A config payload (a request of KindConfig, which only the run's main
// authority may send) and the config as the state file holds it. Wire
// format (little-endian), ConfigSize bytes:
//
//	offset  size  field
//	0       4     capacity
//	4       4     max staleness
//	8       4     round duration
//	12      4     rounds
//	16      1     aggregation (0 mean, 1 clipped-mean, 2 median)
//	17      1     flags: bit 0 secure aggregation; others 0
//	18      2     reserved, 0
//	20      4     server learning rate, float32
//	24      4     clip, float32
//	28      4     noise multiplier (central), float32
//	32      4     local noise multiplier, float32
//	36      4     population
//	40      4     secure aggregation threshold
//	44      8     delta, float64
//	52      4     secure aggregation phase timeout, seconds (0: 30)
//	56      4     secure aggregation neighbors (SecAgg+'s graph degree; 0: all)

// ConfigSize is the size of an encoded config.
const ConfigSize = 60

// EncodeConfig encodes c.
func EncodeConfig(c *Config) []byte {
	b := make([]byte, ConfigSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], c.Capacity)
	le.PutUint32(b[4:], c.MaxStaleness)
	le.PutUint32(b[8:], c.RoundDuration)
	le.PutUint32(b[12:], c.Rounds)
	b[16] = byte(c.Aggregation)
	if c.SecAgg {
		b[17] = 1
	}
	le.PutUint32(b[20:], math.Float32bits(c.ServerLR))
	le.PutUint32(b[24:], math.Float32bits(c.Clip))
	le.PutUint32(b[28:], math.Float32bits(c.NoiseMultiplier))
	le.PutUint32(b[32:], math.Float32bits(c.LocalNoiseMultiplier))
	le.PutUint32(b[36:], c.Population)
	le.PutUint32(b[40:], c.SecAggThreshold)
	le.PutUint64(b[44:], math.Float64bits(c.Delta))
	le.PutUint32(b[52:], c.SecAggTimeout)
	le.PutUint32(b[56:], c.SecAggNeighbors)
	return b
}

// DecodeConfig decodes and validates a config.
func DecodeConfig(b []byte) (*Config, error) {
	if len(b) != ConfigSize {
		return nil, fmt.Errorf("%w: config of %d bytes, want %d", ErrMalformed, len(b), ConfigSize)
	}
	if b[17]&^1 != 0 || b[18] != 0 || b[19] != 0 {
		return nil, fmt.Errorf("%w: config flags or reserved bytes set", ErrMalformed)
	}
	le := binary.LittleEndian
	c := &Config{Capacity: le.Uint32(b[0:]), MaxStaleness: le.Uint32(b[4:]), RoundDuration: le.Uint32(b[8:]),
		Rounds: le.Uint32(b[12:]), Aggregation: Aggregation(b[16]), SecAgg: b[17]&1 != 0,
		ServerLR: math.Float32frombits(le.Uint32(b[20:])), Clip: math.Float32frombits(le.Uint32(b[24:])),
		NoiseMultiplier: math.Float32frombits(le.Uint32(b[28:])), LocalNoiseMultiplier: math.Float32frombits(le.Uint32(b[32:])),
		Population: le.Uint32(b[36:]), SecAggThreshold: le.Uint32(b[40:]), Delta: math.Float64frombits(le.Uint64(b[44:])),
		SecAggTimeout: le.Uint32(b[52:]), SecAggNeighbors: le.Uint32(b[56:])}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}
