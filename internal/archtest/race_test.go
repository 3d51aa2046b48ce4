package archtest

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// singleThreaded reads scripts/single-threaded-packages: the packages
// scripts/test runs without the race detector.
func singleThreaded(t *testing.T, root string) []string {
	f, err := os.Open(filepath.Join(root, "scripts", "single-threaded-packages"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			dirs = append(dirs, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestSingleThreadedPackagesStartNoGoroutine: a package tested without -race
// must not start a goroutine, in its code or its tests; one that does
// belongs back under the race detector.
func TestSingleThreadedPackagesStartNoGoroutine(t *testing.T) {
	root := repoRoot(t)
	dirs := singleThreaded(t, root)
	if len(dirs) == 0 {
		t.Fatal("scripts/single-threaded-packages lists no package")
	}
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if len(files) == 0 {
			t.Errorf("scripts/single-threaded-packages: %s has no Go files", dir)
		}
		for _, file := range files {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, file, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, file)
			for _, line := range goStatements(fset, f) {
				t.Errorf("%s:%d starts a goroutine, but %s is listed in scripts/single-threaded-packages (tested without -race)",
					rel, line, dir)
			}
		}
	}
}

// goStatements lists the lines of f's go statements.
func goStatements(fset *token.FileSet, f *ast.File) []int {
	var lines []int
	ast.Inspect(f, func(n ast.Node) bool {
		if g, ok := n.(*ast.GoStmt); ok {
			lines = append(lines, fset.Position(g.Pos()).Line)
		}
		return true
	})
	return lines
}

// The rule must catch what it is for, wherever the statement hides.
func TestGoStatementsAreFound(t *testing.T) {
	for _, tt := range []struct {
		src  string
		want int
	}{
		{"package x\nfunc f() {}\n", 0},
		{"package x\nfunc f() { go g() }\nfunc g() {}\n", 1},
		{"package x\nvar h = func() {\n\tfor {\n\t\tgo func() {}()\n\t}\n}\n", 1},
		{"package x\nfunc f() { defer func() { go f() }(); go f() }\n", 2},
	} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "x.go", tt.src, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := goStatements(fset, f); len(got) != tt.want {
			t.Errorf("%q: found go statements on lines %v, want %d", tt.src, got, tt.want)
		}
	}
}
