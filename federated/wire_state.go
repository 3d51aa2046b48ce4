package federated

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"sort"

	"github.com/psyche-go/psyche/coordinator"
)

// A federated run's state file (<server dir>/federated/<run id>.fed),
// replaced atomically after every change and before the change is
// acknowledged. Wire format (little-endian):
//
//	offset  size  field
//	0       4     magic "PSFS"
//	4       1     version (StateVersion)
//	5       3     reserved, 0
//	8       60    config (wire_config.go)
//	68      8     round
//	76      8     contributions
//	84      8     privacy-from round (State.PrivacyFrom)
//	92      4     model size n (1..MaxParams)
//	96      4n    model, float32
//	then    32    owner: the coordinator run's authority (State.Owner)
//	then    4     replay entries k, then k × (public key 32, last sequence 8), sorted by key
//	then    4     buffered updates m (≤ MaxCapacity), then m × (client 32, base 8, steps 4, n × float32)
//	then    4     members j (≤ MaxMembers), then j × public key 32, sorted (version 2; a version 1
//	              file has none: its clients join again, which fedclient does when told it is no member)
//	then    4     contributors c (≤ j), then c × (member's public key 32, round of its last aggregated
//	              update 8, 1..round), sorted by key (version 3; an older file has none)
//	end-32  32    SHA-256 of everything before it
//
// The server appends joins to a journal beside it rather than rewriting it
// for each (fedserver: <run id>.joins).

const (
	StateVersion = 3
	stateMagic   = "PSFS"
	// maxReplay bounds the replay table a state file may hold.
	maxReplay = 1 << 20
)

// EncodeState encodes s.
func EncodeState(s *State) []byte {
	n := len(s.Model)
	b := make([]byte, 0, 96+4*n+32+4+40*len(s.Seqs)+4+len(s.Buffer)*(44+4*n)+4+32*len(s.Members)+4+40*len(s.Contributed)+32)
	b = append(b, stateMagic...)
	b = append(b, StateVersion, 0, 0, 0)
	b = append(b, EncodeConfig(&s.Config)...)
	b = binary.LittleEndian.AppendUint64(b, s.Round)
	b = binary.LittleEndian.AppendUint64(b, s.Contributions)
	b = binary.LittleEndian.AppendUint64(b, s.PrivacyFrom)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = appendFloats(b, s.Model)
	b = append(b, s.Owner[:]...)
	keys := make([]coordinator.Pubkey, 0, len(s.Seqs))
	for k := range s.Seqs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return bytes.Compare(keys[i][:], keys[j][:]) < 0 })
	b = binary.LittleEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		b = append(b, k[:]...)
		b = binary.LittleEndian.AppendUint64(b, s.Seqs[k])
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.Buffer)))
	for _, u := range s.Buffer {
		b = append(b, u.Client[:]...)
		b = binary.LittleEndian.AppendUint64(b, u.Base)
		b = binary.LittleEndian.AppendUint32(b, u.Steps)
		b = appendFloats(b, u.Delta)
	}
	members := make([]coordinator.Pubkey, 0, len(s.Members))
	for k := range s.Members {
		members = append(members, k)
	}
	sort.Slice(members, func(i, j int) bool { return bytes.Compare(members[i][:], members[j][:]) < 0 })
	b = binary.LittleEndian.AppendUint32(b, uint32(len(members)))
	for _, k := range members {
		b = append(b, k[:]...)
	}
	contributors := make([]coordinator.Pubkey, 0, len(s.Contributed))
	for k := range s.Contributed {
		contributors = append(contributors, k)
	}
	sort.Slice(contributors, func(i, j int) bool { return bytes.Compare(contributors[i][:], contributors[j][:]) < 0 })
	b = binary.LittleEndian.AppendUint32(b, uint32(len(contributors)))
	for _, k := range contributors {
		b = append(b, k[:]...)
		b = binary.LittleEndian.AppendUint64(b, s.Contributed[k])
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func appendFloats(b []byte, v []float32) []byte {
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b) {
		if r.err == nil {
			r.err = fmt.Errorf("%w: state file truncated", ErrMalformed)
		}
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *reader) floats(n int) []float32 {
	b := r.take(4 * n)
	if b == nil {
		return nil
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// DecodeState decodes a state file, checking its checksum and its config.
func DecodeState(b []byte) (*State, error) {
	if len(b) < 96+32 || string(b[:4]) != stateMagic || b[4] < 1 || b[4] > StateVersion || b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return nil, fmt.Errorf("%w: not a version 1 to %d federated state file", ErrMalformed, StateVersion)
	}
	version := b[4]
	body := b[:len(b)-32]
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], b[len(b)-32:]) {
		return nil, fmt.Errorf("%w: state file checksum mismatch (a torn or corrupted file)", ErrMalformed)
	}
	cfg, err := DecodeConfig(body[8 : 8+ConfigSize])
	if err != nil {
		return nil, err
	}
	r := &reader{b: body[8+ConfigSize:]}
	s := &State{Config: *cfg, Round: r.u64(), Contributions: r.u64(), PrivacyFrom: r.u64(), Seqs: map[coordinator.Pubkey]uint64{},
		Members: map[coordinator.Pubkey]bool{}, Contributed: map[coordinator.Pubkey]uint64{}}
	if r.err == nil && s.PrivacyFrom > s.Round {
		return nil, fmt.Errorf("%w: privacy-from round %d past round %d", ErrMalformed, s.PrivacyFrom, s.Round)
	}
	n := int(r.u32())
	if r.err == nil && (n < 1 || n > MaxParams) {
		return nil, fmt.Errorf("%w: model of %d values", ErrMalformed, n)
	}
	s.Model = r.floats(n)
	copy(s.Owner[:], r.take(32))
	k := int(r.u32())
	if r.err == nil && k > maxReplay {
		return nil, fmt.Errorf("%w: %d replay entries", ErrMalformed, k)
	}
	var prev []byte
	for i := 0; i < k && r.err == nil; i++ {
		key := r.take(32)
		seq := r.u64()
		if r.err != nil {
			break
		}
		if prev != nil && bytes.Compare(prev, key) >= 0 {
			return nil, fmt.Errorf("%w: replay entries out of order", ErrMalformed)
		}
		prev = key
		var pk coordinator.Pubkey
		copy(pk[:], key)
		s.Seqs[pk] = seq
	}
	m := int(r.u32())
	if r.err == nil && m > MaxCapacity {
		return nil, fmt.Errorf("%w: %d buffered updates", ErrMalformed, m)
	}
	for i := 0; i < m && r.err == nil; i++ {
		var u Update
		copy(u.Client[:], r.take(32))
		u.Base, u.Steps = r.u64(), r.u32()
		u.Delta = r.floats(n)
		s.Buffer = append(s.Buffer, u)
	}
	if version >= 2 {
		j := int(r.u32())
		if r.err == nil && j > MaxMembers {
			return nil, fmt.Errorf("%w: %d members", ErrMalformed, j)
		}
		prev = nil
		for i := 0; i < j && r.err == nil; i++ {
			key := r.take(32)
			if r.err != nil {
				break
			}
			if prev != nil && bytes.Compare(prev, key) >= 0 {
				return nil, fmt.Errorf("%w: members out of order", ErrMalformed)
			}
			prev = key
			var pk coordinator.Pubkey
			copy(pk[:], key)
			s.Members[pk] = true
		}
	}
	if version >= 3 {
		c := int(r.u32())
		if r.err == nil && c > len(s.Members) {
			return nil, fmt.Errorf("%w: %d contributors, %d members", ErrMalformed, c, len(s.Members))
		}
		prev = nil
		for i := 0; i < c && r.err == nil; i++ {
			key := r.take(32)
			round := r.u64()
			if r.err != nil {
				break
			}
			if prev != nil && bytes.Compare(prev, key) >= 0 {
				return nil, fmt.Errorf("%w: contributors out of order", ErrMalformed)
			}
			prev = key
			var pk coordinator.Pubkey
			copy(pk[:], key)
			if !s.Members[pk] || round < 1 || round > s.Round {
				return nil, fmt.Errorf("%w: contributor %s (round %d) is no member or past round %d", ErrMalformed, pk, round, s.Round)
			}
			s.Contributed[pk] = round
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(r.b))
	}
	return s, nil
}
