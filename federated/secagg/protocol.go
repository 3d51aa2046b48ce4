package secagg

import (
	"crypto/ecdh"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/crypto/chacha20"
	"golang.org/x/crypto/chacha20poly1305"
)

// ID is a client's index in a round, 1..MaxClients: its Shamir
// coordinate.
type ID uint8

// MaxClients is the most clients a round can have (Shamir over GF(2⁸)).
const MaxClients = 255

var (
	ErrPhase    = errors.New("secagg: message out of phase")
	ErrUnknown  = errors.New("secagg: message from a client not in this phase's set")
	ErrTooFew   = errors.New("secagg: fewer clients than the threshold")
	ErrDecrypt  = errors.New("secagg: a share failed to decrypt (wrong key, or tampered)")
	ErrMismatch = errors.New("secagg: message does not fit the round")
)

// Keys is a client's advertisement: its two X25519 public keys.
type Keys struct {
	ID   ID
	C, S [32]byte // c: encryption, s: pairwise masks
}

// Ciphertext is one encrypted pair of shares, from one client to another.
type Ciphertext struct {
	From, To ID
	Box      []byte // ChaCha20-Poly1305 of the share plaintext (wire_share.go)
}

// Reveal is a survivor's answer in the unmask phase: for each other client
// of the share phase, its share of b (a survivor) or of the s key (a
// dropout).
type Reveal struct {
	From ID
	B, S map[ID][32]byte // by the client whose secret it is a share of
}

// drbg is a ChaCha20 keystream: the randomness a seed expands to.
type drbg struct{ c *chacha20.Cipher }

func newDRBG(seed [32]byte, label string) *drbg {
	k := sha256.Sum256(append([]byte("psyche secagg "+label+"\x00"), seed[:]...))
	c, err := chacha20.NewUnauthenticatedCipher(k[:], make([]byte, chacha20.NonceSize))
	if err != nil {
		panic(err)
	}
	return &drbg{c}
}

func (d *drbg) read(n int) []byte {
	b := make([]byte, n)
	d.c.XORKeyStream(b, b)
	return b
}

// prg expands a 32-byte key into n words mod 2³².
func prg(key [32]byte, n int) []uint32 {
	c, err := chacha20.NewUnauthenticatedCipher(key[:], make([]byte, chacha20.NonceSize))
	if err != nil {
		panic(err)
	}
	b := make([]byte, 4*n)
	c.XORKeyStream(b, b)
	out := make([]uint32, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

func agree(priv *ecdh.PrivateKey, pub [32]byte, label string) ([32]byte, error) {
	p, err := ecdh.X25519().NewPublicKey(pub[:])
	if err != nil {
		return [32]byte{}, err
	}
	shared, err := priv.ECDH(p)
	if err != nil {
		return [32]byte{}, fmt.Errorf("secagg: key agreement: %w", err)
	}
	return sha256.Sum256(append([]byte("psyche secagg "+label+"\x00"), shared...)), nil
}

// pairMask is the mask between u and v from u's s key and v's public one
// (the same from v's side): added by the smaller ID, subtracted by the
// larger.
func addPairMask(y []uint32, u, v ID, priv *ecdh.PrivateKey, pub [32]byte, sign int) error {
	k, err := agree(priv, pub, "mask")
	if err != nil {
		return err
	}
	m := prg(k, len(y))
	if (u < v) == (sign > 0) {
		for i := range y {
			y[i] += m[i]
		}
	} else {
		for i := range y {
			y[i] -= m[i]
		}
	}
	return nil
}

func aad(from, to ID) []byte { return []byte{'s', 'a', byte(from), byte(to)} }

// Client is one client's side of a round.
type Client struct {
	id        ID
	threshold int
	degree    int // SecAgg+'s masking graph (0: every other client)
	c, s      *ecdh.PrivateKey
	b         [32]byte
	rnd       *drbg
	peers     map[ID]Keys // the advertised set
	neighbors map[ID]bool // its neighbors in the masking graph
	shareSet  []ID        // the clients whose shares arrived (step 2 survivors)
	received  map[ID]sharePair
	masked    bool
	revealed  bool
}

// NewClient starts a round for client id with threshold t and masking
// graph degree k (Neighbors; 0: all); seed is its randomness (32 bytes from
// crypto/rand).
func NewClient(id ID, t, k int, seed [32]byte) (*Client, error) {
	if id == 0 || t < 2 {
		return nil, fmt.Errorf("%w: id %d threshold %d", ErrMismatch, id, t)
	}
	r := newDRBG(seed, "client")
	c, err := ecdh.X25519().NewPrivateKey(r.read(32))
	if err != nil {
		return nil, err
	}
	s, err := ecdh.X25519().NewPrivateKey(r.read(32))
	if err != nil {
		return nil, err
	}
	cl := &Client{id: id, threshold: t, degree: k, c: c, s: s, rnd: r, received: map[ID]sharePair{}}
	copy(cl.b[:], r.read(32))
	return cl, nil
}

// Advertise is step 1's message.
func (c *Client) Advertise() Keys {
	var k Keys
	k.ID = c.id
	copy(k.C[:], c.c.PublicKey().Bytes())
	copy(k.S[:], c.s.PublicKey().Bytes())
	return k
}

// Share is step 2: given the advertised keys (its own among them), the
// encrypted shares of b and of its s key for each of its neighbors.
func (c *Client) Share(advertised []Keys) ([]Ciphertext, error) {
	if c.peers != nil {
		return nil, ErrPhase
	}
	if len(advertised) < c.threshold {
		return nil, fmt.Errorf("%w: %d advertised, threshold %d", ErrTooFew, len(advertised), c.threshold)
	}
	c.peers = map[ID]Keys{}
	var ids []ID
	for _, k := range advertised {
		if _, dup := c.peers[k.ID]; dup || k.ID == 0 {
			return nil, fmt.Errorf("%w: client %d advertised twice", ErrMismatch, k.ID)
		}
		c.peers[k.ID] = k
		ids = append(ids, k.ID)
	}
	if _, ok := c.peers[c.id]; !ok {
		return nil, fmt.Errorf("%w: this client (%d) is not in the advertised set", ErrMismatch, c.id)
	}
	c.neighbors = map[ID]bool{}
	xs := []byte{byte(c.id)}
	for _, v := range Neighbors(ids, c.degree, c.id) {
		c.neighbors[v] = true
		xs = append(xs, byte(v))
	}
	if len(xs) < c.threshold {
		return nil, fmt.Errorf("%w: %d neighbors and itself, threshold %d", ErrTooFew, len(xs)-1, c.threshold)
	}
	slices.Sort(xs)
	bShares, err := split(c.b[:], c.threshold, xs, c.rnd.read((c.threshold-1)*32))
	if err != nil {
		return nil, err
	}
	sShares, err := split(c.s.Bytes(), c.threshold, xs, c.rnd.read((c.threshold-1)*32))
	if err != nil {
		return nil, err
	}
	var out []Ciphertext
	for i, x := range xs {
		to := ID(x)
		p := sharePair{From: c.id, To: to}
		copy(p.B[:], bShares[i])
		copy(p.S[:], sShares[i])
		if to == c.id {
			c.received[c.id] = p // its own share, kept
			continue
		}
		key, err := agree(c.c, c.peers[to].C, "enc")
		if err != nil {
			return nil, err
		}
		aead, err := chacha20poly1305.New(key[:])
		if err != nil {
			return nil, err
		}
		// One message per key: the keys are fresh every round.
		box := aead.Seal(nil, make([]byte, aead.NonceSize()), encodeSharePair(&p), aad(c.id, to))
		out = append(out, Ciphertext{From: c.id, To: to, Box: box})
	}
	return out, nil
}

// Mask is step 3: given the ciphertexts addressed to it (whose senders are
// the share phase's survivors), the masked fixed-point input.
func (c *Client) Mask(x []uint32, incoming []Ciphertext) ([]uint32, error) {
	if c.peers == nil || c.masked {
		return nil, ErrPhase
	}
	for _, ct := range incoming {
		k, ok := c.peers[ct.From]
		if !ok || !c.neighbors[ct.From] || ct.To != c.id || ct.From == c.id {
			return nil, fmt.Errorf("%w: a share from %d to %d", ErrUnknown, ct.From, ct.To)
		}
		if _, dup := c.received[ct.From]; dup {
			return nil, fmt.Errorf("%w: two shares from %d", ErrMismatch, ct.From)
		}
		key, err := agree(c.c, k.C, "enc")
		if err != nil {
			return nil, err
		}
		aead, err := chacha20poly1305.New(key[:])
		if err != nil {
			return nil, err
		}
		plain, err := aead.Open(nil, make([]byte, aead.NonceSize()), ct.Box, aad(ct.From, c.id))
		if err != nil {
			return nil, fmt.Errorf("%w: from %d", ErrDecrypt, ct.From)
		}
		p, err := decodeSharePair(plain)
		if err != nil || p.From != ct.From || p.To != c.id {
			return nil, fmt.Errorf("%w: share from %d: %v", ErrMismatch, ct.From, err)
		}
		c.received[ct.From] = *p
	}
	if len(c.received) < c.threshold {
		return nil, fmt.Errorf("%w: shares from %d clients, threshold %d", ErrTooFew, len(c.received), c.threshold)
	}
	c.shareSet = c.shareSet[:0]
	for id := range c.received {
		c.shareSet = append(c.shareSet, id)
	}
	slices.Sort(c.shareSet)
	y := slices.Clone(x)
	self := prg(c.b, len(y))
	for i := range y {
		y[i] += self[i]
	}
	for _, v := range c.shareSet {
		if v == c.id {
			continue
		}
		if err := addPairMask(y, c.id, v, c.s, c.peers[v].S, +1); err != nil {
			return nil, err
		}
	}
	c.masked = true
	return y, nil
}

// Unmask is step 4: survivors are the clients whose masked input the server
// holds. It refuses a survivor set that is not within the share set, or
// below the threshold, and it answers once.
func (c *Client) Unmask(survivors []ID) (*Reveal, error) {
	if !c.masked || c.revealed {
		return nil, ErrPhase
	}
	if len(survivors) < c.threshold {
		return nil, fmt.Errorf("%w: %d survivors", ErrTooFew, len(survivors))
	}
	alive := map[ID]bool{}
	for _, id := range survivors {
		if _, ok := c.peers[id]; !ok {
			return nil, fmt.Errorf("%w: survivor %d did not advertise", ErrUnknown, id)
		}
		if _, ok := c.received[id]; !ok && (id == c.id || c.neighbors[id]) {
			return nil, fmt.Errorf("%w: survivor %d sent this client no share", ErrUnknown, id)
		}
		alive[id] = true
	}
	if !alive[c.id] {
		return nil, fmt.Errorf("%w: this client is not among the survivors", ErrMismatch)
	}
	r := &Reveal{From: c.id, B: map[ID][32]byte{}, S: map[ID][32]byte{}}
	for _, v := range c.shareSet {
		p := c.received[v]
		if alive[v] {
			r.B[v] = p.B
		} else {
			r.S[v] = p.S
		}
	}
	c.revealed = true
	return r, nil
}
