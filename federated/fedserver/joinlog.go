package fedserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
)

// A run's joins are appended to a journal beside its state file
// (<dir>/<run id>.joins) instead of rewriting the state (its model, buffer,
// members and replay table) for each: 6,000 anonymous joins to an open run
// wrote 1.7 GiB for 888 KB received, the state growing with every member,
// so the bytes grew with the square of the joins (~155 GB to MaxMembers).
// A join now writes one record of 44 bytes (fsynced before it is
// acknowledged, as the state is), and the journal is folded into the state
// by the next full write — any other change, or the join that would take
// the journal past 4 times the state file's size (journalShare): what a
// join costs on disk is bounded by a constant times what it sent (6,000
// joins: 888 KB received, 0.6 MB written).
//
// Wire format (little-endian):
//
//	offset  size  field
//	0       4     magic "PSFJ"
//	4       1     version (1)
//	5       3     reserved, 0
//	8       32    the SHA-256 that ends the state file these records follow
//	40      44k   k records: member's public key 32, its join's sequence 8,
//	              CRC-32C of those 40 bytes 4
//
// A journal applies only to the state file whose checksum it names: one
// left by a state written since (a crash between the rename and the
// journal's removal) or by a freed run is ignored. A last record cut short
// or failing its CRC is a join that was never acknowledged (a crash during
// its write) and is dropped; a bad record before the last quarantines the
// run.

const (
	joinsExt       = ".joins"
	joinsMagic     = "PSFJ"
	joinsHeaderLen = 40
	joinRecordLen  = 44
	// A journal is folded into the state file once it would pass
	// journalShare times the state file's size (within [minJournal,
	// maxJournal]). Each new member adds 72 bytes to the state (its key
	// in the members and its replay entry), so each fold rewrites every
	// member so far; at 4× the folds come at a ratio of ~7.6 in the
	// state's size and cost ~1.15 times the final state in all: with its
	// own record, a member ends up costing ~127 bytes written for the
	// 148 of its join (×0.86), where folding at 1× cost ~160 (×1.08).
	journalShare = 4
	minJournal   = 64 << 10
	maxJournal   = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (s *Service) joinsPath(id string) string { return filepath.Join(s.dir, id+joinsExt) }

func joinsHeader(stateSum [32]byte) []byte {
	b := make([]byte, 0, joinsHeaderLen)
	b = append(b, joinsMagic...)
	b = append(b, 1, 0, 0, 0)
	return append(b, stateSum[:]...)
}

func joinRecord(k coordinator.Pubkey, seq uint64) []byte {
	b := make([]byte, 0, joinRecordLen)
	b = append(b, k[:]...)
	b = binary.LittleEndian.AppendUint64(b, seq)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// stateSum is the checksum that ends an encoded state file.
func stateSum(enc []byte) (sum [32]byte) {
	copy(sum[:], enc[len(enc)-32:])
	return sum
}

// replayJoins applies the journal at path to st, whose file ends with sum,
// and returns the journal's length in good records (0: none, or none for
// this state).
func replayJoins(path string, sum [32]byte, st *federated.State) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("fedserver: %w", err)
	}
	if len(b) < joinsHeaderLen || !bytes.Equal(b[:joinsHeaderLen], joinsHeader(sum)) {
		// Another state's journal (or a header cut short: a journal
		// created but never acknowledged): nothing here is this state's.
		return 0, nil
	}
	rest := b[joinsHeaderLen:]
	good := int64(joinsHeaderLen)
	for len(rest) > 0 {
		if len(rest) < joinRecordLen {
			break // a torn last record
		}
		rec := rest[:joinRecordLen]
		if binary.LittleEndian.Uint32(rec[40:]) != crc32.Checksum(rec[:40], castagnoli) {
			if len(rest) == joinRecordLen {
				break // the last record, torn
			}
			return 0, fmt.Errorf("fedserver: %s: %w: a join record at byte %d fails its checksum", path, federated.ErrMalformed, good)
		}
		var k coordinator.Pubkey
		copy(k[:], rec[:32])
		seq := binary.LittleEndian.Uint64(rec[32:40])
		if !st.Members[k] && len(st.Members) >= federated.MaxMembers {
			return 0, fmt.Errorf("fedserver: %s: %w: more than %d members", path, federated.ErrMalformed, federated.MaxMembers)
		}
		st.Members[k] = true
		st.Seqs[k] = max(st.Seqs[k], seq)
		rest = rest[joinRecordLen:]
		good += joinRecordLen
	}
	return good, nil
}

// appendJoin records that k joined with sequence seq (callers hold fr.mu),
// durably, and reports false where the join must go through a full write
// instead: the journal would pass the state's size, or is not open for
// this state (after a restart), or a write failed.
func (s *Service) appendJoin(id string, fr *run, k coordinator.Pubkey, seq uint64) bool {
	if fr.joinsLen+joinRecordLen > min(max(journalShare*fr.stateLen, minJournal), maxJournal) {
		return false
	}
	rec := joinRecord(k, seq)
	if fr.joins == nil {
		if fr.foldJoins {
			// Records from before a restart, or a write that failed
			// part-way: a full write takes them in first.
			return false
		}
		f, err := os.OpenFile(s.joinsPath(id), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			s.log.Warn("opening a federated run's join journal failed; writing the whole state", "run", id, "err", err)
			return false
		}
		fr.joins = f
		rec = append(joinsHeader(fr.stateSum), rec...)
	}
	_, err := fr.joins.Write(rec)
	if err == nil {
		err = fr.joins.Sync()
	}
	if err == nil && fr.joinsLen == 0 {
		syncDir(s.dir) // the new journal's name, before the join is acknowledged
	}
	if err != nil {
		// What reached the file may be a part of a record: a full write
		// replaces the journal.
		s.log.Warn("appending to a federated run's join journal failed; writing the whole state", "run", id, "err", err)
		fr.joins.Close()
		fr.joins, fr.foldJoins = nil, true
		return false
	}
	fr.joinsLen += int64(len(rec))
	s.metrics.Written.WithLabelValues(id, "journal").Add(float64(len(rec)))
	return true
}

// resetJoins forgets the journal once a full state write has taken in its
// records (callers hold fr.mu, or own fr).
func (s *Service) resetJoins(id string, fr *run, enc []byte) {
	if fr.joins != nil {
		fr.joins.Close()
		fr.joins = nil
	}
	fr.stateSum, fr.stateLen, fr.joinsLen, fr.foldJoins = stateSum(enc), int64(len(enc)), 0, false
	if err := os.Remove(s.joinsPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// It names the state before this one, so it is ignored at start;
		// the next join truncates it.
		s.log.Warn("removing a federated run's join journal failed", "run", id, "err", err)
	}
}

// syncDir makes a new file's name durable (best effort, as atomicfile).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
