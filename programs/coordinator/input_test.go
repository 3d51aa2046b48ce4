package coordinator_test

import (
	"encoding/binary"
	"io"
	"math/rand/v2"
	"testing"
)

// The SBPF entrypoint's parser of the loader's serialized input (src/input.c)
// runs in the host harness on exact-size buffers under the address sanitizer:
// well-formed inputs must parse to the right offsets, and every truncation
// and random corruption must be refused or parsed without reading outside the
// buffer.

type serialAccount struct {
	dup              int // -1: not a duplicate
	signer, writable bool
	data             []byte
}

// serialize writes the aligned loader's input format and returns, per
// account, the offsets of its key and data.
func serialize(accounts []serialAccount, data []byte) (in []byte, keyOff, dataOff []int, dataAt, programAt int) {
	u64 := func(v uint64) { in = binary.LittleEndian.AppendUint64(in, v) }
	u64(uint64(len(accounts)))
	for i, a := range accounts {
		if a.dup >= 0 {
			in = append(in, byte(a.dup), 0, 0, 0, 0, 0, 0, 0)
			keyOff, dataOff = append(keyOff, keyOff[a.dup]), append(dataOff, dataOff[a.dup])
			continue
		}
		b := func(v bool) byte {
			if v {
				return 1
			}
			return 0
		}
		in = append(in, 0xff, b(a.signer), b(a.writable), 0, 0, 0, 0, 0)
		keyOff = append(keyOff, len(in))
		for j := 0; j < 32; j++ {
			in = append(in, byte(i*32+j))
		}
		in = append(in, make([]byte, 32)...) // owner
		u64(1000)                            // lamports
		u64(uint64(len(a.data)))
		dataOff = append(dataOff, len(in))
		in = append(in, a.data...)
		in = append(in, make([]byte, 10240)...)
		for len(in)%8 != 0 {
			in = append(in, 0)
		}
		u64(^uint64(0)) // rent epoch
	}
	u64(uint64(len(data)))
	dataAt = len(in)
	in = append(in, data...)
	programAt = len(in)
	in = append(in, make([]byte, 32)...)
	return in, keyOff, dataOff, dataAt, programAt
}

type parsed struct {
	code      uint64
	accounts  [][5]uint64
	dataAt    uint64
	dataLen   uint64
	programAt uint64
}

func (h *harness) parse(t *testing.T, in []byte) parsed {
	t.Helper()
	for _, v := range []uint64{^uint64(0), uint64(len(in))} {
		binary.Write(h.in, binary.LittleEndian, v)
	}
	h.in.Write(in)
	if err := h.in.Flush(); err != nil {
		t.Fatalf("harness: %v\n%s", err, h.stderr.String())
	}
	u64 := func() uint64 {
		var b [8]byte
		if _, err := io.ReadFull(h.out, b[:]); err != nil {
			t.Fatalf("harness died: %v\n%s", err, h.stderr.String())
		}
		return binary.LittleEndian.Uint64(b[:])
	}
	var p parsed
	p.code = u64()
	n := u64()
	for i := uint64(0); i < n; i++ {
		var a [5]uint64
		for j := range a {
			a[j] = u64()
		}
		p.accounts = append(p.accounts, a)
	}
	if p.code == 0 {
		p.dataAt, p.dataLen, p.programAt = u64(), u64(), u64()
	}
	return p
}

func TestInputParser(t *testing.T) {
	h := startHarness(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 40; trial++ {
		var accounts []serialAccount
		for i := rng.IntN(9); i > 0; i-- {
			a := serialAccount{dup: -1, signer: rng.IntN(2) == 0, writable: rng.IntN(2) == 0, data: make([]byte, rng.IntN(100))}
			if len(accounts) > 0 && rng.IntN(4) == 0 {
				a.dup = rng.IntN(len(accounts))
				if accounts[a.dup].dup >= 0 { // duplicates name the first occurrence
					a.dup = accounts[a.dup].dup
				}
			}
			accounts = append(accounts, a)
		}
		data := make([]byte, rng.IntN(50))
		in, keyOff, dataOff, dataAt, programAt := serialize(accounts, data)
		p := h.parse(t, in)
		if p.code != 0 || len(p.accounts) != len(accounts) || p.dataAt != uint64(dataAt) || p.dataLen != uint64(len(data)) || p.programAt != uint64(programAt) {
			t.Fatalf("trial %d: parsed %+v, want %d accounts, data at %d (%d bytes), program id at %d", trial, p, len(accounts), dataAt, len(data), programAt)
		}
		for i, a := range accounts {
			src := a
			if a.dup >= 0 {
				src = accounts[a.dup]
			}
			got := p.accounts[i]
			b2u := func(v bool) uint64 {
				if v {
					return 1
				}
				return 0
			}
			if got[0] != uint64(keyOff[i]) || got[1] != uint64(dataOff[i]) || got[2] != uint64(len(src.data)) || got[3] != b2u(src.signer) || got[4] != b2u(src.writable) {
				t.Fatalf("trial %d account %d: parsed %v, want key %d data %d len %d signer %v writable %v", trial, i, got, keyOff[i], dataOff[i], len(src.data), src.signer, src.writable)
			}
		}
		// Every truncation is refused.
		for n := 0; n < len(in); n += 1 + rng.IntN(64) {
			if p := h.parse(t, in[:n]); p.code == 0 {
				t.Fatalf("trial %d: %d of %d bytes parsed", trial, n, len(in))
			}
		}
		// Corruptions: parsed or refused, never a read outside the buffer
		// (the sanitizer would abort the harness).
		for i := 0; i < 30; i++ {
			c := append([]byte(nil), in...)
			for j := 1 + rng.IntN(3); j > 0; j-- {
				c[rng.IntN(len(c))] = byte(rng.Uint32())
			}
			if rng.IntN(3) == 0 { // a huge length
				binary.LittleEndian.PutUint64(c[rng.IntN(len(c)-8):], rng.Uint64())
			}
			h.parse(t, c)
		}
	}
	if p := h.parse(t, nil); p.code == 0 {
		t.Fatal("empty input parsed")
	}
	if p := h.parse(t, binary.LittleEndian.AppendUint64(nil, 9)); p.code == 0 {
		t.Fatal("nine accounts parsed")
	}
}
