package server

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/atomicfile"
)

// A run is persisted as one file, <dir>/<run id>.run, replaced atomically
// (internal/atomicfile) after every change, so that kill -9 at any moment
// leaves the previous or the new file, never a torn one. Version 2
// (little-endian):
//
//	offset  size  field
//	0       4     magic "PSRS"
//	4       1     version (storeVersion)
//	5       1     kind: 0 a live run, 1 a freed run (a tombstone)
//	6       2     reserved, 0
//	8       8     incarnation: how many times this run id was initialized
//	16      8     replay floor (see replayTable)
//	24      A     live runs only: the coordinator account (coordinator.AccountSize bytes)
//	24+A    4     live runs only: count n of replay entries
//	28+A    40×n  live runs only: sender public key (32), last sequence (8), sorted by key
//	end     32    sha256 of every byte before it
//
// A tombstone keeps the incarnation of a freed run so that its id's next
// init_coordinator must be signed for the next incarnation: requests
// captured before the free never apply again. The checksum catches a
// flipped bit (one in main_authority would lock the real admin out) and a
// file truncated by something other than the server; a file that fails any
// check quarantines its run alone (see Server.quarantine).
//
// Version 1 (no kind, incarnation, floor or checksum) is still read, so a
// server upgrades its runs in place; they are written as version 2 at their
// next change.

const (
	storeMagic     = "PSRS"
	storeVersion   = 2
	storeVersionV1 = 1
	runFileExt     = ".run"
	storeHeader    = 24
	kindLive       = 0
	kindFreed      = 1
	idFile         = "server.id"
	idMagic        = "PSID"
)

// ErrCorrupt is wrapped by every error about a state file that cannot be
// trusted (bad magic, version, length or checksum).
var ErrCorrupt = errors.New("server: corrupt state file")

// stored is what a run file holds.
type stored struct {
	incarnation uint64
	freed       bool
	state       *coordinator.Coordinator // nil when freed
	replay      replayTable
}

func encodeRun(st *stored) []byte {
	n := 0
	if !st.freed {
		n = coordinator.AccountSize + 4 + 40*len(st.replay.seqs)
	}
	b := make([]byte, 0, storeHeader+n+sha256.Size)
	b = append(b, storeMagic...)
	kind := byte(kindLive)
	if st.freed {
		kind = kindFreed
	}
	b = append(b, storeVersion, kind, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, st.incarnation)
	b = binary.LittleEndian.AppendUint64(b, st.replay.floor)
	if !st.freed {
		b = append(b, st.state.MarshalAccount()...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(st.replay.seqs)))
		keys := make([]coordinator.Pubkey, 0, len(st.replay.seqs))
		for k := range st.replay.seqs {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b coordinator.Pubkey) int { return bytes.Compare(a[:], b[:]) })
		for _, k := range keys {
			b = append(b, k[:]...)
			b = binary.LittleEndian.AppendUint64(b, st.replay.seqs[k])
		}
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func decodeRun(b []byte) (*stored, error) {
	if len(b) < 8 || string(b[:4]) != storeMagic {
		return nil, fmt.Errorf("%w: not a run file", ErrCorrupt)
	}
	switch b[4] {
	case storeVersionV1:
		return decodeRunV1(b)
	case storeVersion:
	default:
		return nil, fmt.Errorf("%w: version %d, this server reads %d and %d", ErrCorrupt, b[4], storeVersionV1, storeVersion)
	}
	if len(b) < storeHeader+sha256.Size {
		return nil, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if want := sha256.Sum256(body); !bytes.Equal(sum, want[:]) {
		return nil, fmt.Errorf("%w: checksum mismatch (the file was changed or damaged outside the server)", ErrCorrupt)
	}
	if b[6] != 0 || b[7] != 0 {
		return nil, fmt.Errorf("%w: reserved bytes set", ErrCorrupt)
	}
	st := &stored{incarnation: binary.LittleEndian.Uint64(b[8:]), replay: replayTable{floor: binary.LittleEndian.Uint64(b[16:])}}
	rest := body[storeHeader:]
	switch b[5] {
	case kindFreed:
		if len(rest) != 0 {
			return nil, fmt.Errorf("%w: a freed run's file has %d bytes after its header", ErrCorrupt, len(rest))
		}
		st.freed = true
		return st, nil
	case kindLive:
	default:
		return nil, fmt.Errorf("%w: kind %d", ErrCorrupt, b[5])
	}
	a := coordinator.AccountSize
	if len(rest) < a+4 {
		return nil, fmt.Errorf("%w: %d bytes of account, want %d", ErrCorrupt, len(rest), a+4)
	}
	state, err := coordinator.DecodeAccount(rest[:a])
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	st.state = state
	st.replay.seqs, err = decodeEntries(rest[a:])
	if err != nil {
		return nil, err
	}
	if st.incarnation == 0 {
		return nil, fmt.Errorf("%w: a live run of incarnation 0", ErrCorrupt)
	}
	return st, nil
}

// decodeRunV1 reads the first format: magic, version, 3 reserved bytes, the
// account, the replay entries. Its runs become incarnation 1.
func decodeRunV1(b []byte) (*stored, error) {
	a := coordinator.AccountSize
	if len(b) < 12+a {
		return nil, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	state, err := coordinator.DecodeAccount(b[8 : 8+a])
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	seqs, err := decodeEntries(b[8+a:])
	if err != nil {
		return nil, err
	}
	return &stored{incarnation: 1, state: state, replay: replayTable{seqs: seqs}}, nil
}

// decodeEntries reads a count and that many (key, sequence) entries, which
// must be all of b.
func decodeEntries(b []byte) (map[coordinator.Pubkey]uint64, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: no replay entry count", ErrCorrupt)
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	rest := b[4:]
	if uint64(len(rest)) != 40*n {
		return nil, fmt.Errorf("%w: %d bytes of replay entries, want %d", ErrCorrupt, len(rest), 40*n)
	}
	seqs := make(map[coordinator.Pubkey]uint64, n)
	for i := 0; i < int(n); i++ {
		var k coordinator.Pubkey
		copy(k[:], rest[40*i:])
		if _, dup := seqs[k]; dup {
			return nil, fmt.Errorf("%w: replay entry %s twice", ErrCorrupt, k)
		}
		seqs[k] = binary.LittleEndian.Uint64(rest[40*i+32:])
	}
	return seqs, nil
}

func runPath(dir, id string) string { return filepath.Join(dir, id+runFileExt) }

func saveRun(dir, id string, st *stored) error {
	if err := atomicfile.WriteFile(runPath(dir, id), encodeRun(st), 0o644); err != nil {
		return fmt.Errorf("server: writing %s: %w", runPath(dir, id), err)
	}
	return nil
}

// loaded is what a directory holds: live runs, tombstones of freed ones,
// and runs whose file could not be trusted (by id, with the reason).
type loaded struct {
	runs        map[string]*stored
	quarantined map[string]error
}

// loadRuns reads every run file in dir. Only a directory that cannot be
// listed is an error: a file that cannot be read or trusted quarantines its
// run and the others load.
func loadRuns(dir string) (*loaded, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	out := &loaded{runs: map[string]*stored{}, quarantined: map[string]error{}}
	for _, e := range entries {
		name := e.Name()
		// Names starting with "." are atomicfile's temporary files (a
		// kill -9 between create and rename leaves one behind); run ids
		// never start with "." (checkRunID).
		if e.IsDir() || !strings.HasSuffix(name, runFileExt) || strings.HasPrefix(name, ".") {
			continue
		}
		id := strings.TrimSuffix(name, runFileExt)
		if checkRunID(id) != nil {
			continue // not a name the server writes
		}
		st, err := readRun(filepath.Join(dir, name))
		if err == nil && !st.freed && st.state.RunIDString() != id {
			err = fmt.Errorf("%w: the file holds run %q", ErrCorrupt, st.state.RunIDString())
		}
		if err != nil {
			out.quarantined[id] = fmt.Errorf("run file %s: %w", filepath.Join(dir, name), err)
			continue
		}
		out.runs[id] = st
	}
	return out, nil
}

func readRun(path string) (*stored, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return decodeRun(b)
}

// loadID reads the server's identity from dir, creating it on first use.
// A damaged identity file is replaced by a new identity: that only makes
// every request signed for the old one stale (clients fetch the new one and
// sign again), which is safe, whereas refusing to start would take every run
// down with it.
func loadID(dir string) (id [32]byte, fresh bool, err error) {
	path := filepath.Join(dir, idFile)
	b, err := os.ReadFile(path)
	if err == nil && len(b) == 4+32+sha256.Size && string(b[:4]) == idMagic {
		sum := sha256.Sum256(b[:36])
		if bytes.Equal(sum[:], b[36:]) {
			copy(id[:], b[4:36])
			return id, false, nil
		}
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return id, false, fmt.Errorf("server: %w", err)
	}
	if _, err := rand.Read(id[:]); err != nil {
		return id, false, fmt.Errorf("server: %w", err)
	}
	out := append([]byte(idMagic), id[:]...)
	sum := sha256.Sum256(out)
	if err := atomicfile.WriteFile(path, append(out, sum[:]...), 0o644); err != nil {
		return id, false, fmt.Errorf("server: writing %s: %w", path, err)
	}
	return id, true, nil
}
