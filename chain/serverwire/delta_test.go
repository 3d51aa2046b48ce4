package serverwire

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// decodeDeltaEvent returns the decoded delta of an encoded delta event.
func decodeDeltaEvent(t testing.TB, ev []byte) []byte {
	t.Helper()
	data, ok := bytes.CutPrefix(bytes.TrimSuffix(ev, []byte("\n\n")), []byte("event: delta\ndata: "))
	if !ok {
		t.Fatalf("not a delta event: %.40q", ev)
	}
	d, err := base64.StdEncoding.DecodeString(string(data))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDeltaRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := make([]byte, 4096)
	for i := range base {
		base[i] = byte(rng.Uint32())
	}
	change := func(at ...int) []byte {
		b := bytes.Clone(base)
		for _, i := range at {
			b[i] ^= 0x5a
		}
		return b
	}
	half := make([]int, 0, 2048)
	for i := 0; i < 4096; i += 2 {
		half = append(half, i)
	}
	for _, tc := range []struct {
		name string
		cur  []byte
		runs int // -1: no delta (the whole account is as small)
	}{
		{"nothing changed", change(), 0},
		{"the first byte", change(0), 1},
		{"the last byte", change(4095), 1},
		{"two bytes close together: one run", change(100, 110), 1},
		{"two bytes far apart: two runs", change(100, 200), 2},
		{"a witness slot", change(1000, 1001, 1002, 1500, 1700), 3},
		{"half of it", change(half...), -1},
		{"another length", append(bytes.Clone(base), 1), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := DeltaEvent(base, tc.cur)
			if tc.runs < 0 {
				if ev != nil {
					t.Fatalf("a delta of %d bytes where the whole account is as small", len(ev))
				}
				return
			}
			d := decodeDeltaEvent(t, ev)
			runs := 0
			for rest := d[deltaHeader:]; len(rest) > 0; runs++ {
				rest = rest[8+binary.LittleEndian.Uint32(rest[4:]):]
			}
			if runs != tc.runs {
				t.Errorf("%d runs, want %d", runs, tc.runs)
			}
			acct := bytes.Clone(base)
			if err := ApplyDelta(acct, d); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(acct, tc.cur) {
				t.Fatal("the delta applied is not the new account")
			}
		})
	}
}

func TestDeltaRefusals(t *testing.T) {
	base := bytes.Repeat([]byte{7}, 256)
	cur := bytes.Clone(base)
	cur[10], cur[200] = 1, 2
	good := decodeDeltaEvent(t, DeltaEvent(base, cur))
	header := func(n uint32, runs ...[3]uint32) []byte { // runs: offset, length, fill byte
		d := binary.LittleEndian.AppendUint32(nil, n)
		d = binary.LittleEndian.AppendUint32(d, 0)
		for _, r := range runs {
			d = binary.LittleEndian.AppendUint32(d, r[0])
			d = binary.LittleEndian.AppendUint32(d, r[1])
			d = append(d, bytes.Repeat([]byte{byte(r[2])}, int(r[1]))...)
		}
		return d
	}
	other := bytes.Clone(base)
	other[50] = 9
	for _, tc := range []struct {
		name  string
		acct  []byte
		delta []byte
	}{
		{"empty", base, nil},
		{"a cut header", base, good[:5]},
		{"another account's length", base[:255], good},
		{"a cut run header", base, good[:deltaHeader+5]},
		{"a cut run", base, good[:len(good)-1]},
		{"a run past the end", base, header(256, [3]uint32{250, 10, 1})},
		{"a run of no bytes", base, header(256, [3]uint32{10, 0, 1})},
		{"overlapping runs", base, header(256, [3]uint32{10, 5, 1}, [3]uint32{12, 5, 1})},
		{"runs out of order", base, header(256, [3]uint32{100, 5, 1}, [3]uint32{10, 5, 1})},
		{"an offset that wraps", base, header(256, [3]uint32{1<<32 - 2, 4, 1})},
		{"applied to another base", other, good},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := ApplyDelta(bytes.Clone(tc.acct), tc.delta); !errors.Is(err, errDelta) {
				t.Fatalf("%v, want errDelta", err)
			}
		})
	}
}

// FuzzApplyDelta: a delta is outside bytes (a server, or whoever answers
// as one). Whatever it holds, ApplyDelta neither panics nor writes outside
// the account, and what it accepts has the checksum it names.
func FuzzApplyDelta(f *testing.F) {
	base := bytes.Repeat([]byte{3}, 512)
	cur := bytes.Clone(base)
	cur[0], cur[100], cur[511] = 1, 2, 3
	f.Add(decodeDeltaEvent(f, DeltaEvent(base, cur)))
	f.Add([]byte{0, 2, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, d []byte) {
		acct := bytes.Clone(base)
		if err := ApplyDelta(acct, d); err != nil {
			if !errors.Is(err, errDelta) {
				t.Fatalf("an error that is not errDelta: %v", err)
			}
			return
		}
		if len(acct) != len(base) {
			t.Fatal("the account changed length")
		}
	})
}

// BenchmarkDeltaEvent: what the server spends per subscriber and change (a
// whole account compared, a few changed bytes encoded).
func BenchmarkDeltaEvent(b *testing.B) {
	prev := make([]byte, coordinator.AccountSize)
	cur := bytes.Clone(prev)
	for _, at := range []int{16, 3000, 3001, 90000, 150000} {
		cur[at] = 1
	}
	b.SetBytes(int64(len(cur)))
	for b.Loop() {
		if DeltaEvent(prev, cur) == nil {
			b.Fatal("no delta")
		}
	}
}
