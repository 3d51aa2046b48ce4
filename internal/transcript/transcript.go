// Package transcript runs transcript ("golden") tests in the manner of
// etcd's raft: a file of blocks
//
//	command key=value ...
//	----
//	expected output
//	(blank line)
//
// with # comment lines between blocks. Each command is handed to the test's
// harness, whose output must equal the block's; with rewrite the file is
// written back with the actual outputs, for review in a diff. Only tests
// import it.
package transcript

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type block struct {
	comments []string
	cmd      string
	want     string
}

// RunDir runs every testdata/*.txt as a subtest; harness returns a fresh
// command runner for each file.
func RunDir(t *testing.T, rewrite bool, harness func(t *testing.T) func(cmd string) string) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts in testdata/: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) { Run(t, file, rewrite, harness(t)) })
	}
}

// Run replays one transcript through run (whose output gains a final
// newline if it lacks one) and compares, or rewrites the file.
func Run(t *testing.T, path string, rewrite bool, run func(cmd string) string) {
	var out strings.Builder
	for _, b := range parse(t, path) {
		got := run(b.cmd)
		if !strings.HasSuffix(got, "\n") {
			got += "\n"
		}
		for _, c := range b.comments {
			out.WriteString(c + "\n")
		}
		out.WriteString(b.cmd + "\n----\n" + got + "\n")
		if !rewrite && got != b.want {
			t.Errorf("%s: %s\n got:\n%s\nwant:\n%s", path, b.cmd, got, b.want)
		}
	}
	if rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func parse(t *testing.T, path string) []block {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []block
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
			cur.cmd, state = l, 1
		case 1:
			if l != "----" {
				t.Fatalf("%s:%d: want ---- after the command, got %q", path, line, l)
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
		t.Fatal(err)
	}
	if state == 1 {
		t.Fatalf("%s: command %q has no output section", path, cur.cmd)
	}
	if state == 2 {
		blocks = append(blocks, cur)
	}
	return blocks
}
