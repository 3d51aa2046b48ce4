// Package abi is the one Go description of how the coordinator program is
// called on Solana, beyond the instruction bytes (package coordinator encodes
// those, the same for both backends): the program id that `psyche validator`
// and the tests load it at, the instance PDA (its seeds, size and record),
// and the accounts each instruction takes, in the order the program reads
// them, with the flags it requires. chain/solana builds its transactions
// from it, the IDL generator (programs/coordinator) documents it, and the
// tests compile their transactions with it. It is pure: no I/O.
package abi

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
)

// LocalProgramID is where `psyche validator` and the tests preload the
// coordinator program: sha256("psyche/coordinator-program"). A deployment
// names its own.
var LocalProgramID = coordinator.Pubkey(sha256.Sum256([]byte("psyche/coordinator-program")))

// Well-known accounts the program names (entrypoint.c).
var (
	// SystemProgram creates the coordinator account and funds the instance.
	SystemProgram = mustKey("11111111111111111111111111111111")
	// SlotHashes is the sysvar the round seed is derived from.
	SlotHashes = mustKey("SysvarS1otHashes111111111111111111111111111")
)

func mustKey(s string) coordinator.Pubkey {
	k, err := coordinator.ParsePubkey(s)
	if err != nil {
		panic(err)
	}
	return k
}

// InstanceSeedPrefix is the first seed of a run's instance PDA; the second
// is the run id without its trailing zeros.
const InstanceSeedPrefix = "coordinator"

// InstanceSeeds are the seeds of a run's instance PDA.
func InstanceSeeds(runID [coordinator.MaxRunIDLen]byte) [][]byte {
	return [][]byte{[]byte(InstanceSeedPrefix), []byte(coordinator.FixedString(runID[:]))}
}

// The instance record: the PDA's data, as create_instance in entrypoint.c
// writes it.
//
//	offset  size  field
//	0       8     discriminator: sha256("account:CoordinatorInstance")[0:8]
//	8       1     bump of the PDA
//	9       7     zero
//	16      32    run id (zero-padded)
//	48      32    the run's coordinator account
const (
	InstanceSize     = 80
	InstanceTypeName = "CoordinatorInstance"
)

// InstanceDiscriminator opens every instance record.
var InstanceDiscriminator = func() (d [8]byte) {
	h := sha256.Sum256([]byte("account:" + InstanceTypeName))
	copy(d[:], h[:8])
	return d
}()

// Instance is a decoded instance record.
type Instance struct {
	Bump        uint8
	RunID       [coordinator.MaxRunIDLen]byte
	Coordinator coordinator.Pubkey
}

// ErrInstance means bytes are no instance record.
var ErrInstance = errors.New("abi: not an instance record")

// DecodeInstance reads an instance record.
func DecodeInstance(b []byte) (Instance, error) {
	var in Instance
	if len(b) != InstanceSize {
		return in, fmt.Errorf("%w: %d bytes, want %d", ErrInstance, len(b), InstanceSize)
	}
	if !bytes.Equal(b[:8], InstanceDiscriminator[:]) {
		return in, fmt.Errorf("%w: discriminator %x", ErrInstance, b[:8])
	}
	if !bytes.Equal(b[9:16], make([]byte, 7)) {
		return in, fmt.Errorf("%w: reserved bytes %x are not zero", ErrInstance, b[9:16])
	}
	in.Bump = b[8]
	copy(in.RunID[:], b[16:48])
	copy(in.Coordinator[:], b[48:80])
	return in, nil
}

// Account is one account an instruction takes.
type Account struct {
	Name     string
	Key      coordinator.Pubkey
	Signer   bool
	Writable bool
	Optional bool   // may be left out (join_run's co-signer when the run has no join authority)
	Fixed    bool   // Key is a well-known address (a program or sysvar), the same in every run
	Doc      string // what the program does with it, where that is not obvious
}

// Keys are the run's accounts and the instruction's signers.
type Keys struct {
	Instance    coordinator.Pubkey
	Coordinator coordinator.Pubkey
	Sender      coordinator.Pubkey
	// CoSigner is join_run's co-signing join authority; nil leaves the
	// optional account out.
	CoSigner *coordinator.Pubkey
}

// Accounts lists what instruction name takes, in order: [instance,
// coordinator, sender, extras...]. The program checks that the coordinator
// account is writable and the sender signs; it writes the instance only in
// init_coordinator and free_coordinator, and the sender only in
// free_coordinator (which pays it both accounts' lamports). The extras are the system program for
// init_coordinator, the join authority's co-signature for join_run, and the
// SlotHashes sysvar for tick and warmup_witness; a co-signer for any other
// instruction is an error. (The fee payer is writable
// in any transaction; the flags here are what the program itself requires.)
// An unknown name is an error.
func Accounts(name string, k Keys) ([]Account, error) {
	sender, ok := senderNames[name]
	if !ok {
		return nil, fmt.Errorf("abi: no instruction %q", name)
	}
	if k.CoSigner != nil && name != "join_run" {
		return nil, fmt.Errorf("abi: %s takes no co-signer (only join_run does)", name)
	}
	lifecycle := name == "init_coordinator" || name == "free_coordinator"
	out := []Account{
		{Name: "instance", Key: k.Instance, Writable: lifecycle, Doc: `PDA ["coordinator", run_id without its trailing zeros]`},
		{Name: "coordinator", Key: k.Coordinator, Writable: true},
		{Name: sender, Key: k.Sender, Signer: true},
	}
	switch name {
	case "init_coordinator":
		out = append(out, Account{Name: "system_program", Key: SystemProgram, Fixed: true})
	case "free_coordinator":
		out[2].Writable = true
		out[2].Doc = "receives the lamports of both accounts"
	case "join_run":
		if k.CoSigner != nil {
			out = append(out, Account{Name: "join_authority", Key: *k.CoSigner, Signer: true, Optional: true,
				Doc: "The run's join authority, co-signing, when the run has one."})
		}
	case "tick", "warmup_witness":
		out = append(out, Account{Name: "slot_hashes", Key: SlotHashes, Fixed: true,
			Doc: "The round seed is derived from it (and the Clock, the coordinator key and the nonce)."})
	}
	return out, nil
}

// senderNames names each instruction's sender (the IDL shows them).
var senderNames = map[string]string{"init_coordinator": "authority", "update": "authority", "set_paused": "authority",
	"join_run": "client", "tick": "sender", "warmup_witness": "witness", "witness": "witness",
	"health_check": "client", "checkpoint": "checkpointer", "free_coordinator": "authority"}
