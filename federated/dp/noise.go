package dp

import (
	"encoding/binary"
	"math"

	"golang.org/x/crypto/chacha20"
)

// Clip scales v in place so that its L2 norm is at most bound (bound ≤ 0:
// no clipping) and returns the norm it had.
func Clip(v []float32, bound float64) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	norm := math.Sqrt(s)
	if bound > 0 && norm > bound {
		f := float32(bound / norm)
		for i := range v {
			v[i] *= f
		}
	}
	return norm
}

// Noise is a stream of standard normal numbers drawn from a ChaCha20
// keystream (Box-Muller on 53-bit uniforms).
type Noise struct {
	c     *chacha20.Cipher
	buf   [64]byte
	off   int
	spare float64
	has   bool
}

// NewNoise returns the stream of seed.
func NewNoise(seed [32]byte) *Noise {
	c, err := chacha20.NewUnauthenticatedCipher(seed[:], make([]byte, chacha20.NonceSize))
	if err != nil {
		panic(err) // key and nonce sizes are fixed
	}
	return &Noise{c: c, off: 64}
}

func (n *Noise) uint64() uint64 {
	if n.off == len(n.buf) {
		clear(n.buf[:])
		n.c.XORKeyStream(n.buf[:], n.buf[:])
		n.off = 0
	}
	v := binary.LittleEndian.Uint64(n.buf[n.off:])
	n.off += 8
	return v
}

// uniform is in (0, 1].
func (n *Noise) uniform() float64 { return (float64(n.uint64()>>11) + 1) / (1 << 53) }

// Normal returns the next N(0, 1) number.
func (n *Noise) Normal() float64 {
	if n.has {
		n.has = false
		return n.spare
	}
	r := math.Sqrt(-2 * math.Log(n.uniform()))
	s, c := math.Sincos(2 * math.Pi * n.uniform())
	n.spare, n.has = r*s, true
	return r * c
}

// Add adds N(0, std²) to every element of v.
func (n *Noise) Add(v []float32, std float64) {
	if std <= 0 {
		return
	}
	for i := range v {
		v[i] += float32(std * n.Normal())
	}
}
