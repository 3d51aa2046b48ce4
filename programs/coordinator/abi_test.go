package coordinator_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	coord "github.com/psyche-go/psyche/coordinator"
)

// TestErrorCodesMatchGo checks the C error enum (src/psyche.h) against the Go
// error table, name by name, so both sides return the same custom codes.
func TestErrorCodesMatchGo(t *testing.T) {
	src, err := os.ReadFile("src/psyche.h")
	if err != nil {
		t.Fatal(err)
	}
	c := map[string]uint32{}
	for _, m := range regexp.MustCompile(`(?m)^\s*ERR_([A-Z0-9_]+) = (\d+),`).FindAllStringSubmatch(string(src), -1) {
		n, _ := strconv.Atoi(m[2])
		c[m[1]] = uint32(n)
	}
	if len(c) != len(coord.Errors()) {
		t.Errorf("psyche.h has %d error codes, Go has %d", len(c), len(coord.Errors()))
	}
	for _, e := range coord.Errors() {
		if got, ok := c[screaming(e.Name)]; !ok || got != e.Code {
			t.Errorf("Go %s = %d; psyche.h ERR_%s = %d (present %v)", e.Name, e.Code, screaming(e.Name), got, ok)
		}
	}
}

// screaming turns "WrongSize" into "WRONG_SIZE" and "InvalidRunID" into "INVALID_RUN_ID".
func screaming(name string) string {
	var b strings.Builder
	r := []rune(name)
	for i, ch := range r {
		if i > 0 && unicode.IsUpper(ch) && (unicode.IsLower(r[i-1]) || (i+1 < len(r) && unicode.IsLower(r[i+1]))) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(ch))
	}
	return b.String()
}

// cMember maps a row name of coordinator/testdata/account_layout.golden to
// the member designator of struct psy_account (src/psyche.h), which flattens
// a few nested Go structs.
func cMember(name string) string {
	for _, r := range []struct{ from, to string }{
		{"model.checkpoint.kind", "model.checkpoint_kind"},
		{"model.lr.kind", "model.lr_kind"},
		{"model.lr.total_steps", "model.lr_total_steps"},
		{"model.lr.", "model."},
		{"model.optimizer.kind", "model.optimizer_kind"},
		{"model.optimizer.", "model."},
		{"model.store.", "model.store_"},
		{".metadata.", "."},
		{"clients[0].signer", "clients[0].id.signer"},
		{"clients[0].p2p", "clients[0].id.p2p"},
		{"exited[0].signer", "exited[0].id.signer"},
		{"exited[0].p2p", "exited[0].id.p2p"},
	} {
		if strings.HasPrefix(r.from, ".") || strings.Contains(r.from, "[0]") {
			name = strings.Replace(name, r.from, r.to, 1)
		} else if strings.HasPrefix(name, r.from) {
			name = r.to + strings.TrimPrefix(name, r.from)
		}
	}
	return name
}

// TestLayoutMatchesGolden compiles a program that prints offsetof and sizeof
// of every row of the Go layout table for the C struct, and compares. (The
// differential tests compare whole accounts too; this names the field.)
func TestLayoutMatchesGolden(t *testing.T) {
	buildHarness(t) // skips without a C compiler
	rows, err := coord.LayoutTable()
	if err != nil {
		t.Fatal(err)
	}
	var src bytes.Buffer
	src.WriteString("#include <stdio.h>\n#include \"psyche.h\"\n#define M(f) printf(\"%zu %zu\\n\", __builtin_offsetof(struct psy_account, f), sizeof(((struct psy_account *)0)->f))\nint main(void) {\n")
	fmt.Fprintf(&src, "printf(\"%%zu 0\\n\", sizeof(struct psy_account));\n")
	for _, r := range rows {
		m := cMember(r.Name)
		if r.Count > 1 {
			m += "[0]"
		}
		fmt.Fprintf(&src, "M(%s);\n", m)
	}
	src.WriteString("return 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "layout.c"), src.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs("src")
	bin := filepath.Join(dir, "layout")
	var out []byte
	for _, cc := range compilers() {
		if out, err = exec.Command(cc, "-DPSY_HOST", "-I", abs, "-o", bin, filepath.Join(dir, "layout.c")).CombinedOutput(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("compiling the layout probe: %v\n%s", err, out)
	}
	out, err = exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(rows)+1 {
		t.Fatalf("%d lines for %d rows", len(lines), len(rows))
	}
	if want := fmt.Sprintf("%d 0", coord.AccountSize); lines[0] != want {
		t.Errorf("sizeof(struct psy_account) line %q, want %q", lines[0], want)
	}
	for i, r := range rows {
		if want := fmt.Sprintf("%d %d", r.Offset, r.Size); lines[i+1] != want {
			t.Errorf("%s (C %s): offset/size %s, want %s", r.Name, cMember(r.Name), lines[i+1], want)
		}
	}
}
