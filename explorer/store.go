package explorer

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/psyche-go/psyche/internal/atomicfile"
)

// pointStore keeps each run's points in a file of its own under dir, one
// JSON object per line, appended as points are made or change (a later line
// for a step replaces an earlier one), and rewritten whole when the changes
// outnumber the points: so an explorer that restarts (the server's) shows a
// run's history from its first step, not from the restart.
type pointStore struct {
	dir   string
	lines map[string]int // lines in each run's file
}

func newPointStore(dir string) (*pointStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("explorer: history directory: %w", err)
	}
	return &pointStore{dir: dir, lines: map[string]int{}}, nil
}

// path is run id's file. Run ids are [A-Za-z0-9._-], so they name files
// safely, but "." and ".." are not files of dir.
func (s *pointStore) path(id string) string {
	return filepath.Join(s.dir, "run-"+id+".points")
}

// maxLine bounds one line of the file: a Point is a few hundred bytes.
const maxLine = 4096

// load returns run id's points, by step. A line that does not parse (the
// last one, cut by a crash) is skipped.
func (s *pointStore) load(id string) ([]Point, error) {
	b, err := os.ReadFile(s.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("explorer: %w", err)
	}
	byStep := map[uint32]Point{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, maxLine), maxLine)
	n := 0
	for sc.Scan() {
		n++
		var p Point
		if json.Unmarshal(sc.Bytes(), &p) == nil {
			byStep[p.Step] = p
		}
	}
	s.lines[id] = n
	out := make([]Point, 0, len(byStep))
	for _, p := range byStep {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Point) int { return cmp.Compare(a.Step, b.Step) })
	if over := len(out) - MaxPoints; over > 0 {
		out = out[over:]
	}
	return out, nil
}

// save records changed points of run id; all is the run's whole history,
// written instead when the file has grown to more than twice its length.
func (s *pointStore) save(id string, changed, all []Point) error {
	if len(changed) == 0 {
		return nil
	}
	if s.lines[id]+len(changed) > 2*len(all)+1000 {
		var buf bytes.Buffer
		for _, p := range all {
			if err := appendLine(&buf, p); err != nil {
				return err
			}
		}
		if err := atomicfile.WriteFile(s.path(id), buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("explorer: %w", err)
		}
		s.lines[id] = len(all)
		return nil
	}
	var buf bytes.Buffer
	for _, p := range changed {
		if err := appendLine(&buf, p); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(s.path(id), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("explorer: %w", err)
	}
	_, werr := f.Write(buf.Bytes())
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("explorer: %w", err)
	}
	s.lines[id] += len(changed)
	return nil
}

func appendLine(buf *bytes.Buffer, p Point) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	buf.Write(b)
	buf.WriteByte('\n')
	return nil
}
