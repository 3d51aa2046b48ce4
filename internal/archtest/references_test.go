package archtest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// outsideRefs are words that point out of the repository, at files or a
// tracker a reader of the repository does not have. Each has its why, for
// the failure message.
var outsideRefs = []struct {
	re  *regexp.Regexp
	why string
}{
	{regexp.MustCompile(`\.\./shared\b|/work/shared\b`), "a folder beside or above the checkout"},
	{regexp.MustCompile(`\bDESIGN\.md\b`), "a design file the repository does not have (docs/architecture.md is the design)"},
	// "issue 17", "issues #16", "Issue 3": a tracker's number. Qualified
	// references to a public project's tracker (golang/go#75804) name
	// where they point and are not matched.
	{regexp.MustCompile(`(?i)\b(issue|ticket|pull request|PR)s?\s+#?[0-9]+\b`), "a number in a tracker the repository does not hold"},
	// A bare #17: not after a word character, '/', '&' (an HTML entity,
	// &#39;) or another '#'; a number that does not start with 0 and is
	// not followed by a word character, so #include, CSS colours (#fff,
	// #0072b2, #607D8B) and markdown headings ("# Use", "## 2. Join") stay
	// out. colourRef below keeps out the colours made of digits alone.
	{regexp.MustCompile(`(^|[^[:alnum:]_/&#])#[1-9][0-9]*\b`), "a number in a tracker the repository does not hold"},
}

// colourRef is a CSS colour made of digits alone (#333, #123456, #12345678),
// which the bare-number rule would take for an issue in a style sheet,
// script or page.
var colourRef = regexp.MustCompile(`#([0-9]{3}|[0-9]{4}|[0-9]{6}|[0-9]{8})\b`)

var styleFile = regexp.MustCompile(`\.(css|scss|html|js|mjs|ts|svg)$`)

// TestNoReferencesOutsideTheRepository reads every file git tracks (and
// every untracked one it does not ignore) and fails on a line that refers to
// a file or an issue tracker outside the repository: a reader of the
// repository could not follow it.
func TestNoReferencesOutsideTheRepository(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: it lists the repository's files")
	}
	root := repoRoot(t)
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git ls-files in %s: %v (not a git checkout)", root, err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if len(files) < 100 {
		t.Fatalf("git ls-files listed %d files in %s; want the whole repository", len(files), root)
	}
	for _, rel := range files {
		if rel == selfPath {
			continue // its examples are the rules' own test cases
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil || bytes.IndexByte(b, 0) >= 0 {
			continue // deleted in the working tree, a link to a folder, or binary
		}
		for _, p := range refProblems(rel, string(b)) {
			t.Error(p)
		}
	}
}

// selfPath is this file, whose examples would match.
const selfPath = "internal/archtest/references_test.go"

// refProblems lists the lines of file (its path and text) that refer outside
// the repository, each as "path:line: what: the line".
func refProblems(path, text string) []string {
	var out []string
lines:
	for i, line := range strings.Split(text, "\n") {
		for _, r := range outsideRefs {
			for _, m := range r.re.FindAllString(line, -1) {
				if styleFile.MatchString(path) && colourRef.MatchString(m) {
					continue
				}
				if len(line) > 200 {
					line = line[:200] + "…"
				}
				out = append(out, fmt.Sprintf("%s:%d: refers to %s (%s); say it in the repository's own words or drop it: %s",
					path, i+1, r.why, strings.TrimSpace(m), strings.TrimSpace(line)))
				continue lines // one report a line
			}
		}
	}
	return out
}

// TestReferenceRules: what the rules above catch, and the look-alikes they
// must let through.
func TestReferenceRules(t *testing.T) {
	for _, tc := range []struct {
		path, line string
		caught     bool
	}{
		{"docs/a.md", "measured before (issue #16), then after", true},
		{"docs/a.md", "issue 17's targets", true},
		{"docs/a.md", "see Issues 3 and 4", true},
		{"x.go", "// fixed in #45.", true},
		{"x.go", "// (#45)", true},
		{"scripts/x", "# see ../" + "shared/notes", true}, // split: this file must not hold the words it checks for
		{"scripts/x", "# docs: /work/shared/notes/gpu.md", true},
		{"x.go", "// as DESIGN" + ".md says", true},
		{"x.c", "#include <stdint.h>", false},
		{"docs/a.md", "## 2. Join", false},
		{"docs/a.md", "# Running", false},
		{"scripts/x", "# a shell comment, 2 issues here", false},
		{"scripts/x", "#!/usr/bin/env bash", false},
		{"x.css", ".a{color:#fff;background:#0072b2;border:#607D8B;fill:#333}", false},
		{"x.js", `return {"'": "&#39;"}`, false},
		{"x.js", `var fs="#000",so=fs+"0"`, false},
		{"scripts/test", "# (golang/go#75804, fixed in Go 1.27)", false},
		{"x.go", "// the 2nd issue of the two: a retry", false},
		{"x.go", "x := a[#1]", true},
	} {
		got := len(refProblems(tc.path, tc.line)) > 0
		if got != tc.caught {
			t.Errorf("%s: %q: caught %v, want %v", tc.path, tc.line, got, tc.caught)
		}
	}
}
