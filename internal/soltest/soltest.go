// Package soltest is the Solana plumbing the tests share, written from
// Solana's wire formats rather than taken from a client library, so that the
// local validator and the coordinator program are checked against the
// formats themselves: legacy transactions compiled and signed by hand,
// program-derived addresses with their own on-curve check, and a JSON-RPC
// client that fails the test on a transport error. Only tests import it.
package soltest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// Meta is one account of an instruction.
type Meta struct {
	Key              []byte
	Signer, Writable bool
}

// Instruction is a program, its accounts in order, and its data.
type Instruction struct {
	Program  []byte
	Accounts []Meta
	Data     []byte
}

// Pub is a private key's public key.
func Pub(k ed25519.PrivateKey) []byte { return k.Public().(ed25519.PublicKey) }

// CompileTx builds and signs a legacy transaction paid by payer. Accounts
// are ordered as the runtime requires (writable signers from the payer on,
// read-only signers, writable others, read-only others, each key once with
// its flags merged); every signer's private key is payer or in signers.
func CompileTx(payer ed25519.PrivateKey, signers []ed25519.PrivateKey, blockhash []byte, ixs ...Instruction) []byte {
	type entry struct {
		key              []byte
		signer, writable bool
	}
	var keys []*entry
	index := map[string]*entry{}
	add := func(k []byte, signer, writable bool) {
		if e, ok := index[string(k)]; ok {
			e.signer, e.writable = e.signer || signer, e.writable || writable
			return
		}
		e := &entry{k, signer, writable}
		index[string(k)] = e
		keys = append(keys, e)
	}
	add(Pub(payer), true, true)
	for _, ix := range ixs {
		for _, a := range ix.Accounts {
			add(a.Key, a.Signer, a.Writable)
		}
		add(ix.Program, false, false)
	}
	rank := func(e *entry) int {
		switch {
		case e.signer && e.writable:
			return 0
		case e.signer:
			return 1
		case e.writable:
			return 2
		}
		return 3
	}
	var ordered []*entry
	for r := 0; r < 4; r++ {
		for _, e := range keys {
			if rank(e) == r {
				ordered = append(ordered, e)
			}
		}
	}
	pos := map[string]byte{}
	var nsig, roSigned, roUnsigned byte
	for i, e := range ordered {
		pos[string(e.key)] = byte(i)
		switch rank(e) {
		case 0:
			nsig++
		case 1:
			nsig++
			roSigned++
		case 3:
			roUnsigned++
		}
	}
	// The message: header, account keys, blockhash, instructions (each a
	// program index, account indices and data, lengths as compact-u16).
	msg := []byte{nsig, roSigned, roUnsigned}
	msg = AppendCompactU16(msg, len(ordered))
	for _, e := range ordered {
		msg = append(msg, e.key...)
	}
	msg = append(msg, blockhash...)
	msg = AppendCompactU16(msg, len(ixs))
	for _, ix := range ixs {
		msg = append(msg, pos[string(ix.Program)])
		msg = AppendCompactU16(msg, len(ix.Accounts))
		for _, a := range ix.Accounts {
			msg = append(msg, pos[string(a.Key)])
		}
		msg = AppendCompactU16(msg, len(ix.Data))
		msg = append(msg, ix.Data...)
	}
	byPub := map[string]ed25519.PrivateKey{string(Pub(payer)): payer}
	for _, s := range signers {
		byPub[string(Pub(s))] = s
	}
	tx := AppendCompactU16(nil, int(nsig))
	for _, e := range ordered[:nsig] {
		tx = append(tx, ed25519.Sign(byPub[string(e.key)], msg)...)
	}
	return append(tx, msg...)
}

// AppendCompactU16 appends n in Solana's compact-u16 (7 bits a byte, low
// first, the high bit set on all but the last).
func AppendCompactU16(b []byte, n int) []byte {
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// OnCurve reports whether 32 bytes decode to a point of edwards25519 (RFC
// 8032 §5.1.3): program-derived addresses must not.
func OnCurve(k []byte) bool {
	p := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
	le := make([]byte, 32)
	for i := range k {
		le[31-i] = k[i]
	}
	le[0] &= 0x7f
	y := new(big.Int).SetBytes(le)
	if y.Cmp(p) >= 0 {
		return false
	}
	// d = -121665/121666
	d := new(big.Int).Mul(big.NewInt(-121665), new(big.Int).ModInverse(big.NewInt(121666), p))
	d.Mod(d, p)
	y2 := new(big.Int).Mul(y, y)
	u := new(big.Int).Sub(y2, big.NewInt(1))
	v := new(big.Int).Add(new(big.Int).Mul(d, y2), big.NewInt(1))
	x2 := new(big.Int).Mul(u, new(big.Int).ModInverse(v.Mod(v, p), p))
	x2.Mod(x2, p)
	if x2.Sign() == 0 {
		return k[31]&0x80 == 0
	}
	// Euler's criterion: x² must be a square.
	e := new(big.Int).Rsh(new(big.Int).Sub(p, big.NewInt(1)), 1)
	return new(big.Int).Exp(x2, e, p).Cmp(big.NewInt(1)) == 0
}

// FindProgramAddress is Solana's find_program_address: the first bump from
// 255 down whose sha256(seeds ‖ bump ‖ program ‖ "ProgramDerivedAddress") is
// off the curve.
func FindProgramAddress(seeds [][]byte, program []byte) (address []byte, bump byte) {
	for b := 255; b >= 0; b-- {
		h := sha256.New()
		for _, s := range seeds {
			h.Write(s)
		}
		h.Write([]byte{byte(b)})
		h.Write(program)
		h.Write([]byte("ProgramDerivedAddress"))
		if k := h.Sum(nil); !OnCurve(k) {
			return k, byte(b)
		}
	}
	panic("soltest: no program address")
}

// Key decodes a base58 address, failing the test if it is not one.
func Key(t testing.TB, s string) []byte {
	t.Helper()
	k, err := coordinator.ParsePubkey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k[:]
}

// RPC is a JSON-RPC client over HTTP.
type RPC struct {
	URL string
	id  int
}

// RPCError is a JSON-RPC error (Code -1: the transport failed).
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

// Try calls method and returns its result or error.
func (c *RPC) Try(method string, params ...any) (json.RawMessage, *RPCError) {
	c.id++
	if params == nil {
		params = []any{}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method, "params": params})
	resp, err := http.Post(c.URL, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, &RPCError{Code: -1, Message: err.Error()}
	}
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage `json:"result"`
		Error  *RPCError       `json:"error"`
		ID     int             `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, &RPCError{Code: -1, Message: err.Error()}
	}
	if out.ID != c.id {
		return nil, &RPCError{Code: -1, Message: fmt.Sprintf("response id %d, want %d", out.ID, c.id)}
	}
	return out.Result, out.Error
}

// Call calls method and fails the test on any error.
func (c *RPC) Call(t testing.TB, method string, params ...any) json.RawMessage {
	t.Helper()
	res, err := c.Try(method, params...)
	if err != nil {
		t.Fatalf("%s: %+v", method, err)
	}
	return res
}

// Decode unmarshals a result (numbers as json.Number), failing the test on
// error.
func (c *RPC) Decode(t testing.TB, raw json.RawMessage, v any) {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
}
