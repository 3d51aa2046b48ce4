package serverwire

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The event stream (GET /v1/runs/{id}/events) is server-sent events, one
// per change of the run:
//
//	data: <base64 of the whole account>
//
// A subscriber that asks for deltas (?deltas=1) gets the whole account
// first, and then, where it is smaller, what changed since the account the
// stream sent last:
//
//	event: delta
//	data: <base64 of: u32 account length, u32 CRC-32C of the new account,
//	      then runs of (u32 offset, u32 length, the bytes)>
//
// all little-endian, runs in increasing offset order and not overlapping.
// A round changes a few witness slots and counters of the 163 KB account:
// about a kilobyte. The length and the checksum catch a delta applied to
// another base (never, on one ordered stream, but a bug should not pass as
// a state).

// deltaHeader is the length and checksum before the runs.
const deltaHeader = 8

// deltaGap is the longest unchanged stretch a run spans rather than start
// a new run (a run header is 8 bytes).
const deltaGap = 16

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// DeltaEvent is the delta event from prev to cur, or nil where the whole
// account is as small (other lengths, or most of it changed). The scale
// simulator (tools/simscale) sizes its streams with it.
func DeltaEvent(prev, cur []byte) []byte {
	if len(prev) != len(cur) || uint64(len(cur)) > 1<<31 {
		return nil
	}
	d := binary.LittleEndian.AppendUint32(nil, uint32(len(cur)))
	d = binary.LittleEndian.AppendUint32(d, crc32.Checksum(cur, castagnoli))
	for i := 0; i < len(cur); {
		// Unchanged stretches, most of the account, go by in blocks.
		for i+64 <= len(cur) && bytes.Equal(prev[i:i+64], cur[i:i+64]) {
			i += 64
		}
		if i >= len(cur) {
			break
		}
		if prev[i] == cur[i] {
			i++
			continue
		}
		// A run from i to the last changed byte before an unchanged
		// stretch longer than deltaGap.
		end, same := i+1, 0
		for j := i + 1; j < len(cur) && same <= deltaGap; j++ {
			if prev[j] == cur[j] {
				same++
			} else {
				end, same = j+1, 0
			}
		}
		d = binary.LittleEndian.AppendUint32(d, uint32(i))
		d = binary.LittleEndian.AppendUint32(d, uint32(end-i))
		d = append(d, cur[i:end]...)
		if len(d) > len(cur)/2 {
			return nil
		}
		i = end
	}
	ev := make([]byte, 0, 24+base64.StdEncoding.EncodedLen(len(d)))
	ev = append(ev, "event: delta\ndata: "...)
	ev = base64.StdEncoding.AppendEncode(ev, d)
	return append(ev, "\n\n"...)
}

// errDelta is a delta that does not apply to the account the stream holds.
var errDelta = errors.New("server: an event delta that does not apply")

// ApplyDelta applies a decoded delta to acct in place. When it fails, acct
// may hold part of it: the stream is then ended, and the next one starts
// with a whole account.
func ApplyDelta(acct, d []byte) error {
	if len(d) < deltaHeader {
		return fmt.Errorf("%w: %d bytes", errDelta, len(d))
	}
	if n := binary.LittleEndian.Uint32(d); uint64(n) != uint64(len(acct)) {
		return fmt.Errorf("%w: for an account of %d bytes, this one has %d", errDelta, n, len(acct))
	}
	sum := binary.LittleEndian.Uint32(d[4:])
	// Check every run before writing any.
	runs, last := d[deltaHeader:], 0
	for rest := runs; len(rest) > 0; {
		if len(rest) < 8 {
			return fmt.Errorf("%w: a cut run header", errDelta)
		}
		off, n := uint64(binary.LittleEndian.Uint32(rest)), uint64(binary.LittleEndian.Uint32(rest[4:]))
		if n == 0 || off < uint64(last) || off+n > uint64(len(acct)) || uint64(len(rest)-8) < n {
			return fmt.Errorf("%w: a run of %d bytes at %d", errDelta, n, off)
		}
		last = int(off + n)
		rest = rest[8+n:]
	}
	for rest := runs; len(rest) > 0; {
		off, n := binary.LittleEndian.Uint32(rest), binary.LittleEndian.Uint32(rest[4:])
		copy(acct[off:off+n], rest[8:8+n])
		rest = rest[8+n:]
	}
	if crc32.Checksum(acct, castagnoli) != sum {
		return fmt.Errorf("%w: the result's checksum differs", errDelta)
	}
	return nil
}
