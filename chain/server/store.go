package server

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/internal/atomicfile"
)

// A run is persisted as one file, <dir>/<run id>.run, replaced atomically
// after every change (little-endian):
//
//	offset  size  field
//	0       4     magic "PSRS"
//	4       1     version (storeVersion)
//	5       3     reserved, 0
//	8       A     the coordinator account (coordinator.AccountSize bytes)
//	8+A     4     count of replay entries
//	12+A    40×n  replay entries: sender public key (32), last sequence (8), sorted by key

const (
	storeMagic   = "PSRS"
	storeVersion = 1
	runFileExt   = ".run"
)

func encodeRun(state *coordinator.Coordinator, seqs map[coordinator.Pubkey]uint64) []byte {
	b := make([]byte, 0, 12+coordinator.AccountSize+40*len(seqs))
	b = append(b, storeMagic...)
	b = append(b, storeVersion, 0, 0, 0)
	b = append(b, state.MarshalAccount()...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(seqs)))
	keys := make([]coordinator.Pubkey, 0, len(seqs))
	for k := range seqs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return string(keys[i][:]) < string(keys[j][:]) })
	for _, k := range keys {
		b = append(b, k[:]...)
		b = binary.LittleEndian.AppendUint64(b, seqs[k])
	}
	return b
}

func decodeRun(b []byte) (*coordinator.Coordinator, map[coordinator.Pubkey]uint64, error) {
	a := coordinator.AccountSize
	if len(b) < 12+a || string(b[:4]) != storeMagic || b[4] != storeVersion {
		return nil, nil, fmt.Errorf("server: not a run file of version %d", storeVersion)
	}
	state, err := coordinator.DecodeAccount(b[8 : 8+a])
	if err != nil {
		return nil, nil, err
	}
	n := int(binary.LittleEndian.Uint32(b[8+a:]))
	rest := b[12+a:]
	if len(rest) != 40*n {
		return nil, nil, fmt.Errorf("server: run file has %d bytes of replay entries, want %d", len(rest), 40*n)
	}
	seqs := make(map[coordinator.Pubkey]uint64, n)
	for i := 0; i < n; i++ {
		var k coordinator.Pubkey
		copy(k[:], rest[40*i:])
		seqs[k] = binary.LittleEndian.Uint64(rest[40*i+32:])
	}
	return state, seqs, nil
}

func runPath(dir, id string) string { return filepath.Join(dir, id+runFileExt) }

func saveRun(dir, id string, state *coordinator.Coordinator, seqs map[coordinator.Pubkey]uint64) error {
	if err := atomicfile.WriteFile(runPath(dir, id), encodeRun(state, seqs), 0o644); err != nil {
		return fmt.Errorf("server: writing %s: %w", runPath(dir, id), err)
	}
	return nil
}

// loadRuns reads every run file in dir.
func loadRuns(dir string) (map[string]*run, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	runs := map[string]*run{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, runFileExt) || strings.HasPrefix(name, ".") {
			continue
		}
		id := strings.TrimSuffix(name, runFileExt)
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		state, seqs, err := decodeRun(b)
		if err != nil {
			return nil, fmt.Errorf("server: run file %s: %w", name, err)
		}
		if state.RunIDString() != id {
			return nil, fmt.Errorf("server: run file %s holds run %q", name, state.RunIDString())
		}
		runs[id] = newRun(state, seqs)
	}
	return runs, nil
}
