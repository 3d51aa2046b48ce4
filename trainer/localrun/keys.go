package localrun

import (
	"crypto/ed25519"
	"crypto/sha256"
	"strconv"
	"strings"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
)

// Keys derives a local run's keys from names: the key of a role ("admin",
// trainer i's signer, trainer i's p2p host) is the hash of
// "[Prefix ]role[ i][ Suffix]". Nothing secret is at stake on one
// machine, and derived keys make a run's members the same every time it
// is made the same way (the tests rely on it: which trainer witnesses
// which round depends on the keys).
type Keys struct {
	Prefix string // names the harness's user ("localnet"; empty: none)
	Suffix string // names the run, when keys must differ between runs (empty: none)
}

// seed is the key seed of role, of trainer i (i < 0: not a trainer's).
func (k Keys) seed(role string, i int) [32]byte {
	parts := make([]string, 0, 4)
	if k.Prefix != "" {
		parts = append(parts, k.Prefix)
	}
	parts = append(parts, role)
	if i >= 0 {
		parts = append(parts, strconv.Itoa(i))
	}
	if k.Suffix != "" {
		parts = append(parts, k.Suffix)
	}
	return sha256.Sum256([]byte(strings.Join(parts, " ")))
}

// Admin is the run's main authority: it creates the run (Create).
func (k Keys) Admin() *chain.Keypair { return chain.KeypairFromSeed(k.seed("admin", -1)) }

// Trainer is trainer i's signer.
func (k Keys) Trainer(i int) *chain.Keypair { return chain.KeypairFromSeed(k.seed("trainer", i)) }

// P2P is trainer i's p2p host key.
func (k Keys) P2P(i int) ed25519.PrivateKey {
	s := k.seed("p2p", i)
	return ed25519.NewKeyFromSeed(s[:])
}

// ID is trainer i's client id: its signer and its p2p host's public keys.
func (k Keys) ID(i int) coordinator.ClientID {
	var p2p coordinator.Pubkey
	copy(p2p[:], k.P2P(i).Public().(ed25519.PublicKey))
	return coordinator.ClientID{Signer: k.Trainer(i).Public(), P2P: p2p}
}
