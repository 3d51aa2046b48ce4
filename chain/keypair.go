package chain

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/atomicfile"
)

// Signer signs instructions with an ed25519 key.
type Signer interface {
	Public() coordinator.Pubkey
	Sign(msg []byte) []byte
}

// Keypair is an ed25519 key pair. On disk it uses the Solana CLI's format: a
// JSON array of the 64 bytes of the private key (seed then public key), so
// the same file works with the Solana tools.
type Keypair struct {
	priv ed25519.PrivateKey
}

// NewKeypair draws a fresh key pair.
func NewKeypair() (*Keypair, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("chain: generating a key: %w", err)
	}
	return &Keypair{priv: priv}, nil
}

// KeypairFromSeed derives a key pair from a 32-byte seed (for tests and
// reproducible local runs).
func KeypairFromSeed(seed [32]byte) *Keypair {
	return &Keypair{priv: ed25519.NewKeyFromSeed(seed[:])}
}

// Public implements Signer.
func (k *Keypair) Public() coordinator.Pubkey {
	var p coordinator.Pubkey
	copy(p[:], k.priv.Public().(ed25519.PublicKey))
	return p
}

// Sign implements Signer.
func (k *Keypair) Sign(msg []byte) []byte { return ed25519.Sign(k.priv, msg) }

// Verify checks an ed25519 signature.
func Verify(pub coordinator.Pubkey, msg, sig []byte) bool {
	return len(sig) == ed25519.SignatureSize && ed25519.Verify(pub[:], msg, sig)
}

// LoadKeypair reads a key file in the Solana CLI format and checks that its
// public half matches its private half.
func LoadKeypair(path string) (*Keypair, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("chain: reading key file: %w", err)
	}
	var raw []int
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("chain: key file %s is not a JSON array of bytes: %w", path, err)
	}
	if len(raw) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("chain: key file %s holds %d bytes, want %d", path, len(raw), ed25519.PrivateKeySize)
	}
	priv := make(ed25519.PrivateKey, ed25519.PrivateKeySize)
	for i, v := range raw {
		if v < 0 || v > 255 {
			return nil, fmt.Errorf("chain: key file %s has %d at byte %d", path, v, i)
		}
		priv[i] = byte(v)
	}
	k := &Keypair{priv: ed25519.NewKeyFromSeed(priv[:32])}
	if string(k.priv) != string(priv) {
		return nil, fmt.Errorf("chain: key file %s: public key does not match the private key", path)
	}
	return k, nil
}

// ErrKeyExists is returned (wrapped) by Save when the file is already there.
var ErrKeyExists = errors.New("key file exists")

// Save writes the key file atomically with mode 0600, refusing to overwrite
// an existing file: the key it holds may be the only copy of an identity.
func (k *Keypair) Save(ctx context.Context, path string) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("chain: %s: %w; refusing to overwrite a key", path, ErrKeyExists)
	}
	return k.Replace(ctx, path)
}

// Replace writes the key file atomically with mode 0600, replacing any file
// there.
func (k *Keypair) Replace(ctx context.Context, path string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	raw := make([]int, len(k.priv))
	for i, b := range k.priv {
		raw[i] = int(b)
	}
	b, _ := json.Marshal(raw)
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("chain: writing %s: %w", path, err)
	}
	return nil
}
