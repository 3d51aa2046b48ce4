package libp2p

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/psyche-go/psyche/internal/atomicfile"
	"github.com/psyche-go/psyche/p2p"
)

// Key files hold the libp2p protobuf encoding of the private key (the format
// every libp2p tool reads), written 0600 and atomically so that a crash never
// leaves a half-written identity behind.

// LoadKey reads an ed25519 identity from path.
func LoadKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", p2p.ErrKeyFile, path, err)
	}
	if k.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("%w: %s: key type %v, want ed25519", p2p.ErrKeyFile, path, k.Type())
	}
	raw, err := k.Raw()
	if err != nil || len(raw) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: %s: %d-byte key", p2p.ErrKeyFile, path, len(raw))
	}
	return ed25519.PrivateKey(raw), nil
}

// SaveKey writes key to path (mode 0600), replacing any file there.
func SaveKey(path string, key ed25519.PrivateKey) error {
	k, err := crypto.UnmarshalEd25519PrivateKey(key)
	if err != nil {
		return fmt.Errorf("%w: %v", p2p.ErrKeyFile, err)
	}
	b, err := crypto.MarshalPrivateKey(k)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, 0o600)
}

// LoadOrCreateKey loads the key at path, or generates and saves one if no
// file exists. Any other read error is returned: silently replacing an
// unreadable identity would change the node's peer id under the run.
func LoadOrCreateKey(path string) (ed25519.PrivateKey, error) {
	key, err := LoadKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	_, key, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return key, SaveKey(path, key)
}
