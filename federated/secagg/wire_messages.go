package secagg

import (
	"encoding/binary"
	"fmt"
)

// The payloads of a secure aggregation round's requests (each carried in a
// signed federated request, federated.KindSecAgg*). Every one starts with
// the round (the model version) the client trained on. Little-endian:
//
//	advertise (72 bytes):  base 8 | c public key 32 | s public key 32
//	shares:                base 8 | from 1 | count k 1 | k × (to 1 | box 82)
//	masked:                base 8 | from 1 | reserved 3 | count n 4 (1..MaxValues) | n × uint32
//	reveal:                base 8 | from 1 | b count 1 | s count 1 | reserved 1 | b × (id 1 | share 32) | s × (id 1 | share 32)

// MaxValues bounds a masked input (as federated.MaxParams bounds a model).
const MaxValues = 1 << 24

const boxSize = sharePairSize + 16

// Advertisement is the advertise payload.
type Advertisement struct {
	Base uint64
	C, S [32]byte
}

func EncodeAdvertisement(a *Advertisement) []byte {
	b := binary.LittleEndian.AppendUint64(nil, a.Base)
	b = append(b, a.C[:]...)
	return append(b, a.S[:]...)
}

func DecodeAdvertisement(b []byte) (*Advertisement, error) {
	if len(b) != 72 {
		return nil, fmt.Errorf("%w: advertisement of %d bytes", ErrMismatch, len(b))
	}
	a := &Advertisement{Base: binary.LittleEndian.Uint64(b)}
	copy(a.C[:], b[8:40])
	copy(a.S[:], b[40:72])
	return a, nil
}

// EncodeShares is the shares payload.
func EncodeShares(base uint64, from ID, cts []Ciphertext) []byte {
	b := binary.LittleEndian.AppendUint64(nil, base)
	b = append(b, byte(from), byte(len(cts)))
	for _, ct := range cts {
		b = append(b, byte(ct.To))
		b = append(b, ct.Box...)
	}
	return b
}

func DecodeShares(b []byte) (base uint64, from ID, cts []Ciphertext, err error) {
	if len(b) < 10 {
		return 0, 0, nil, fmt.Errorf("%w: shares of %d bytes", ErrMismatch, len(b))
	}
	base, from = binary.LittleEndian.Uint64(b), ID(b[8])
	k := int(b[9])
	if len(b) != 10+k*(1+boxSize) {
		return 0, 0, nil, fmt.Errorf("%w: %d shares in %d bytes", ErrMismatch, k, len(b))
	}
	for i := range k {
		p := b[10+i*(1+boxSize):]
		cts = append(cts, Ciphertext{From: from, To: ID(p[0]), Box: append([]byte(nil), p[1:1+boxSize]...)})
	}
	return base, from, cts, nil
}

// EncodeMasked is the masked payload.
func EncodeMasked(base uint64, from ID, y []uint32) []byte {
	b := make([]byte, 16, 16+4*len(y))
	binary.LittleEndian.PutUint64(b, base)
	b[8] = byte(from)
	binary.LittleEndian.PutUint32(b[12:], uint32(len(y)))
	for _, v := range y {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

func DecodeMasked(b []byte) (base uint64, from ID, y []uint32, err error) {
	if len(b) < 16 || b[9] != 0 || b[10] != 0 || b[11] != 0 {
		return 0, 0, nil, fmt.Errorf("%w: masked input of %d bytes", ErrMismatch, len(b))
	}
	n := binary.LittleEndian.Uint32(b[12:])
	if n < 1 || n > MaxValues || len(b) != 16+4*int(n) {
		return 0, 0, nil, fmt.Errorf("%w: %d values in %d bytes", ErrMismatch, n, len(b))
	}
	y = make([]uint32, n)
	for i := range y {
		y[i] = binary.LittleEndian.Uint32(b[16+4*i:])
	}
	return binary.LittleEndian.Uint64(b), ID(b[8]), y, nil
}

// EncodeReveal is the reveal payload (ids in ascending order).
func EncodeReveal(base uint64, r *Reveal) []byte {
	b := binary.LittleEndian.AppendUint64(nil, base)
	b = append(b, byte(r.From), byte(len(r.B)), byte(len(r.S)), 0)
	for _, m := range []map[ID][32]byte{r.B, r.S} {
		for _, id := range sortedIDs(m) {
			sh := m[id]
			b = append(b, byte(id))
			b = append(b, sh[:]...)
		}
	}
	return b
}

func DecodeReveal(b []byte) (uint64, *Reveal, error) {
	if len(b) < 12 || b[11] != 0 {
		return 0, nil, fmt.Errorf("%w: reveal of %d bytes", ErrMismatch, len(b))
	}
	nb, ns := int(b[9]), int(b[10])
	if len(b) != 12+33*(nb+ns) {
		return 0, nil, fmt.Errorf("%w: %d+%d shares in %d bytes", ErrMismatch, nb, ns, len(b))
	}
	r := &Reveal{From: ID(b[8]), B: map[ID][32]byte{}, S: map[ID][32]byte{}}
	var last ID
	for i := range nb + ns {
		p := b[12+33*i:]
		m := r.B
		if i >= nb {
			m = r.S
		}
		if i == nb {
			last = 0
		}
		id := ID(p[0])
		if id <= last {
			return 0, nil, fmt.Errorf("%w: reveal ids out of order", ErrMismatch)
		}
		last = id
		m[id] = [32]byte(p[1:33])
	}
	return binary.LittleEndian.Uint64(b), r, nil
}

// View is the server's JSON answer to a client's wait for a phase to
// close: the advertised keys, the client's inbox of encrypted shares, or
// the survivors, and the fixed-point fraction bits of the round.
type View struct {
	Base         uint64       `json:"base"`
	ID           ID           `json:"id,omitempty"`
	FractionBits int          `json:"fraction_bits"`
	Keys         []Keys       `json:"keys,omitempty"`
	Inbox        []Ciphertext `json:"inbox,omitempty"`
	Survivors    []ID         `json:"survivors,omitempty"`
}
