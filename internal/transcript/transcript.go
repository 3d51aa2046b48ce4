// Package transcript runs transcript ("golden") tests in the manner of
// etcd's raft: a file of blocks
//
//	command key=value ...
//	----
//	expected output
//	(blank line)
//
// with # comment lines between blocks. Each command is handed to the test's
// harness as Args, whose output must equal the block's; a key=value the
// harness never read is a failure naming the file, line and key (a misspelt
// key would otherwise silently take its default). With rewrite the file is
// written back with the actual outputs, comments kept, for review in a
// diff. Only tests import it.
package transcript

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type block struct {
	comments []string
	line     int // the command's, from 1
	cmd      string
	want     string
}

// RunDir runs every testdata/*.txt as a subtest; harness returns a fresh
// command runner for each file.
func RunDir(t *testing.T, rewrite bool, harness func(t *testing.T) func(a *Args) string) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts in testdata/: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) { Run(t, file, rewrite, harness(t)) })
	}
}

// Run replays one transcript through run (whose output gains a final
// newline if it lacks one) and compares, or rewrites the file. A key or
// word of a command that run did not read fails the test.
func Run(t *testing.T, path string, rewrite bool, run func(a *Args) string) {
	problems, err := replay(path, rewrite, run)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// replay is Run, returning what differs or was not read instead of failing.
func replay(path string, rewrite bool, run func(a *Args) string) (problems []string, err error) {
	blocks, trailing, err := parse(path)
	if err != nil {
		return nil, err
	}
	var out strings.Builder
	for _, b := range blocks {
		a := ParseArgs(b.cmd)
		got := run(a)
		for _, k := range a.Unread() {
			problems = append(problems, fmt.Sprintf("%s:%d: command %q does not read %q: check its spelling against the harness's keys", path, b.line, a.Cmd, k))
		}
		if !strings.HasSuffix(got, "\n") {
			got += "\n"
		}
		for _, c := range b.comments {
			out.WriteString(c + "\n")
		}
		out.WriteString(b.cmd + "\n----\n" + got + "\n")
		if !rewrite && got != b.want {
			problems = append(problems, fmt.Sprintf("%s:%d: %s\n got:\n%s\nwant:\n%s", path, b.line, b.cmd, got, b.want))
		}
	}
	for _, c := range trailing {
		out.WriteString(c + "\n")
	}
	if rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			return problems, err
		}
	}
	return problems, nil
}

// parse reads a transcript's blocks and the comment lines after the last
// one.
func parse(path string) (blocks []block, trailing []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var cur block
	state := 0 // 0: between blocks, 1: after the command, 2: reading output
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		l := sc.Text()
		switch state {
		case 0:
			if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
				cur.comments = append(cur.comments, l)
				continue
			}
			cur.cmd, cur.line, state = l, line, 1
		case 1:
			if l != "----" {
				return nil, nil, fmt.Errorf("%s:%d: want ---- after the command, got %q", path, line, l)
			}
			state = 2
		case 2:
			if l == "" {
				blocks, cur, state = append(blocks, cur), block{}, 0
				continue
			}
			cur.want += l + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	switch state {
	case 1:
		return nil, nil, fmt.Errorf("%s:%d: command %q has no output section", path, cur.line, cur.cmd)
	case 2:
		return append(blocks, cur), nil, nil
	}
	return blocks, cur.comments, nil
}
