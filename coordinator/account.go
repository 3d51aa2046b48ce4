package coordinator

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Account layout (all little-endian, every field naturally aligned):
//
//	offset  size  field
//	0       8     discriminator = sha256("account:CoordinatorAccount")[0:8]
//	8       4     version (AccountVersion)
//	12      4     reserved, zero
//	16      8     nonce
//	24      ...   the Coordinator fields in declaration order
//
// The complete table, one row per field, is LayoutTable(); the test compares
// it with testdata/account_layout.golden so that any change is reviewed, and the
// C program's struct is checked against the same file.
const (
	AccountVersion    = 2 // 2: the model's checkpoint store (224 bytes after the optimizer)
	AccountHeaderSize = 16
)

// AccountDiscriminator marks a coordinator account (the Anchor convention for
// account types).
var AccountDiscriminator = discriminator("account:CoordinatorAccount")

func discriminator(preimage string) [8]byte {
	h := sha256.Sum256([]byte(preimage))
	var d [8]byte
	copy(d[:], h[:8])
	return d
}

func (c *cursor) account(s *Coordinator) {
	disc := AccountDiscriminator
	version := uint32(AccountVersion)
	c.bytes("discriminator", disc[:])
	if c.mode == modeDecode && c.err == nil && disc != AccountDiscriminator {
		c.fail("%w: got %x", ErrWrongDiscriminator, disc[:])
		return
	}
	c.u32("version", &version)
	if c.mode == modeDecode && c.err == nil && version != AccountVersion {
		c.fail("%w: account has version %d, this build reads %d", ErrWrongVersion, version, AccountVersion)
		return
	}
	c.pad(4)
	c.coordinator(s)
}

// AccountSize is the exact size of a coordinator account in bytes.
var AccountSize = func() int {
	c := cursor{mode: modeLayout}
	c.account(&Coordinator{})
	return c.off
}()

// LayoutTable describes every field of the account: its dotted name, byte
// offset and size. Arrays of structs appear once, with their first element's
// fields spelled out and a row giving the element count and stride.
func LayoutTable() ([]LayoutField, error) {
	c := cursor{mode: modeLayout}
	c.account(&Coordinator{})
	return c.fields, c.err
}

// EncodeAccount writes s into buf, which must be AccountSize bytes long.
func (s *Coordinator) EncodeAccount(buf []byte) error {
	if len(buf) != AccountSize {
		return fmt.Errorf("%w: buffer is %d bytes, account is %d", ErrWrongSize, len(buf), AccountSize)
	}
	c := cursor{mode: modeEncode, buf: buf}
	c.account(s)
	return c.err
}

// MarshalAccount returns the account bytes of s.
func (s *Coordinator) MarshalAccount() []byte {
	buf := make([]byte, AccountSize)
	if err := s.EncodeAccount(buf); err != nil {
		panic(err) // the buffer has the right size, so this cannot happen
	}
	return buf
}

// DecodeAccount parses account bytes. It rejects a wrong size, discriminator or
// version, non-zero padding, and any value that the state machine could not
// have produced (an unknown enum, a list longer than its capacity), so that
// every method is safe to call on the result.
func DecodeAccount(buf []byte) (*Coordinator, error) {
	s := new(Coordinator)
	if err := s.DecodeAccountInto(buf); err != nil {
		return nil, err
	}
	return s, nil
}

// AccountHeadSize is the length of an account's head: the bytes
// DecodeAccountHead reads (discriminator, version, nonce, ..., run_state).
// A client that needs only those (the Solana backend, for a receipt) asks
// for this slice of the account instead of all AccountSize bytes.
var AccountHeadSize = headOffsets["run_state"] + 1

// headOffsets are the offsets of the fields DecodeAccountHead reads, from
// the layout itself.
var headOffsets = func() map[string]int {
	fields, err := LayoutTable()
	if err != nil {
		panic(err)
	}
	m := map[string]int{}
	for _, f := range fields {
		switch f.Name {
		case "version", "nonce", "run_state":
			m[f.Name] = f.Offset
		}
	}
	return m
}()

// DecodeAccountHead reads the nonce and run state from the first
// AccountHeadSize bytes of an account (or all of it), checking the
// discriminator and version as DecodeAccount does.
func DecodeAccountHead(buf []byte) (nonce uint64, state RunState, err error) {
	if len(buf) < AccountHeadSize {
		return 0, 0, fmt.Errorf("%w: account head is %d bytes, want %d", ErrWrongSize, len(buf), AccountHeadSize)
	}
	if !bytes.Equal(buf[:len(AccountDiscriminator)], AccountDiscriminator[:]) {
		return 0, 0, fmt.Errorf("%w: got %x", ErrWrongDiscriminator, buf[:len(AccountDiscriminator)])
	}
	if v := binary.LittleEndian.Uint32(buf[headOffsets["version"]:]); v != AccountVersion {
		return 0, 0, fmt.Errorf("%w: account has version %d, this build reads %d", ErrWrongVersion, v, AccountVersion)
	}
	return binary.LittleEndian.Uint64(buf[headOffsets["nonce"]:]), RunState(buf[headOffsets["run_state"]]), nil
}

// DecodeAccountInto is DecodeAccount into an existing value (which is
// overwritten even when an error is returned).
func (s *Coordinator) DecodeAccountInto(buf []byte) error {
	if len(buf) != AccountSize {
		return fmt.Errorf("%w: account is %d bytes, want %d", ErrWrongSize, len(buf), AccountSize)
	}
	c := cursor{mode: modeDecode, buf: buf}
	c.account(s)
	if c.err != nil {
		return c.err
	}
	return s.checkWellFormed()
}

// IsAccount reports whether buf starts like a coordinator account of any version.
func IsAccount(buf []byte) bool {
	return len(buf) >= 8 && bytes.Equal(buf[:8], AccountDiscriminator[:])
}

func (s *Coordinator) checkWellFormed() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
	}
	switch {
	case s.RunState >= numRunStates:
		return bad("run state %d", s.RunState)
	case s.Epoch.ClientsLen > MaxClients:
		return bad("%d clients", s.Epoch.ClientsLen)
	case s.Epoch.ExitedLen > MaxExitedClients:
		return bad("%d exited clients", s.Epoch.ExitedLen)
	case s.PendingLen > MaxClients:
		return bad("%d pending clients", s.PendingLen)
	case s.Epoch.CurrentRound >= NumRounds:
		return bad("current round slot %d", s.Epoch.CurrentRound)
	}
	for i := range s.Epoch.Rounds {
		r := &s.Epoch.Rounds[i]
		if r.WitnessesLen > MaxWitnesses || r.ClientsLen > MaxClients {
			return bad("round slot %d has %d witnesses and %d clients", i, r.WitnessesLen, r.ClientsLen)
		}
	}
	for i := range s.Epoch.Clients {
		if s.Epoch.Clients[i].State >= numClientStates {
			return bad("client %d state %d", i, s.Epoch.Clients[i].State)
		}
	}
	for i := range s.Epoch.Exited {
		if s.Epoch.Exited[i].State >= numClientStates {
			return bad("exited client %d state %d", i, s.Epoch.Exited[i].State)
		}
	}
	return nil
}
