package archtest

import (
	"bytes"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// pureRules lists the packages that must stay pure (no clock, randomness, I/O
// or logging) and the modules outside the standard library they may use.
var pureRules = map[string][]string{
	"coordinator": {"github.com/bits-and-blooms/bloom/v3"},
	"distro":      nil,
	"federated": {"github.com/psyche-go/psyche/coordinator", "github.com/psyche-go/psyche/distro",
		"github.com/psyche-go/psyche/federated/dp", "github.com/psyche-go/psyche/trainer/modelspec"},
	"federated/dp":     {"golang.org/x/crypto/chacha20"},
	"federated/secagg": {"golang.org/x/crypto/chacha20", "golang.org/x/crypto/chacha20poly1305"},
	"trainer/schedule": {"github.com/psyche-go/psyche/coordinator"},
	"programs/abi":     {"github.com/psyche-go/psyche/coordinator"},
	// What a run says about its model, read without building one.
	"trainer/modelspec": {"github.com/psyche-go/psyche/coordinator", "github.com/psyche-go/psyche/distro"},
	// The trainer's decision machine: its driver (trainer/node) does the
	// clock, the network, the engine and the logs. p2p is the network's
	// contract (types and interfaces), not a network; modelspec (pure) reads
	// the config of the model an epoch ended holding, which decides whether
	// it is kept.
	"trainer/node/machine": {"github.com/psyche-go/psyche/coordinator", "github.com/psyche-go/psyche/distro",
		"github.com/psyche-go/psyche/p2p", "github.com/psyche-go/psyche/trainer/schedule",
		"github.com/psyche-go/psyche/trainer/modelspec"},
	// How a machine's Readies are carried out (field order, pauses): the
	// node and the simulator bring the effects.
	"trainer/node/drive": {"github.com/psyche-go/psyche/coordinator", "github.com/psyche-go/psyche/distro",
		"github.com/psyche-go/psyche/p2p", "github.com/psyche-go/psyche/trainer/node/machine",
		"github.com/psyche-go/psyche/trainer/modelspec"},
}

// forbidden are standard packages that bring time, randomness, I/O or logging.
var forbidden = []string{"time", "math/rand", "math/rand/v2", "crypto/rand", "os", "os/exec", "os/signal",
	"net", "net/http", "log", "log/slog", "syscall", "unsafe", "io/ioutil", "io/fs", "runtime"}

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// goList runs go list with args in the repository root and returns its
// answer: what it printed on stdout.
func goList(t *testing.T, args ...string) string {
	t.Helper()
	out, _ := goListEnv(t, nil, args...)
	return out
}

// goListEnv runs go list with args in the repository root, with env added
// to the environment, and returns its stdout and its stderr apart. go
// reports its own progress on stderr ("go: downloading …" when the module
// cache lacks a module), which is no package and no import: only stdout is
// parsed, and stderr is quoted when go list fails.
func goListEnv(t *testing.T, env []string, args ...string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), env...)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, errBuf.Bytes())
	}
	return string(out), errBuf.String()
}

func isStdlib(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

func TestPurePackagesImportNothingImpure(t *testing.T) {
	root := repoRoot(t)
	for dir, allowed := range pureRules {
		files, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if len(files) == 0 {
			t.Fatalf("%s: no Go files", dir)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue // tests may use the clock, files and randomness
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				rel, _ := filepath.Rel(root, file)
				for _, bad := range forbidden {
					if path == bad {
						t.Errorf("%s imports %q: %s must stay pure", rel, path, dir)
					}
				}
				if !isStdlib(path) && !contains(allowed, path) {
					t.Errorf("%s imports %q: only the standard library%s is allowed in %s", rel, path, also(allowed), dir)
				}
			}
		}
	}
}

// TestPurePackagesDependencyClosure checks the transitive closure too: no
// module outside the allowed ones (and their own dependencies) sneaks in.
func TestPurePackagesDependencyClosure(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found")
	}
	allowedModules := map[string][]string{
		"coordinator": {"github.com/bits-and-blooms/bloom/v3", "github.com/bits-and-blooms/bitset"},
		"distro":      nil,
		"federated": {"github.com/psyche-go/psyche/coordinator", "github.com/bits-and-blooms/bloom/v3", "github.com/bits-and-blooms/bitset",
			"golang.org/x/crypto/chacha20", "golang.org/x/crypto/internal/alias", "github.com/psyche-go/psyche/distro",
			"github.com/psyche-go/psyche/trainer/modelspec"},
		"federated/dp":     {"golang.org/x/crypto/chacha20", "golang.org/x/crypto/internal/alias"},
		"trainer/schedule": {"github.com/psyche-go/psyche/coordinator", "github.com/bits-and-blooms/bloom/v3", "github.com/bits-and-blooms/bitset"},
		"programs/abi":     {"github.com/psyche-go/psyche/coordinator", "github.com/bits-and-blooms/bloom/v3", "github.com/bits-and-blooms/bitset"},
		"trainer/modelspec": {"github.com/psyche-go/psyche/coordinator", "github.com/bits-and-blooms/bloom/v3", "github.com/bits-and-blooms/bitset",
			"github.com/psyche-go/psyche/distro"},
		"trainer/node/machine": {"github.com/psyche-go/psyche/coordinator", "github.com/bits-and-blooms/bloom/v3", "github.com/bits-and-blooms/bitset",
			"github.com/psyche-go/psyche/distro", "github.com/psyche-go/psyche/p2p", "github.com/psyche-go/psyche/trainer/schedule",
			"lukechampine.com/blake3", "github.com/klauspost/cpuid/v2", "github.com/psyche-go/psyche/trainer/modelspec"},
		"trainer/node/drive": {"github.com/psyche-go/psyche/coordinator", "github.com/bits-and-blooms/bloom/v3", "github.com/bits-and-blooms/bitset",
			"github.com/psyche-go/psyche/distro", "github.com/psyche-go/psyche/p2p", "github.com/psyche-go/psyche/trainer/schedule",
			"github.com/psyche-go/psyche/trainer/node/machine", "lukechampine.com/blake3", "github.com/klauspost/cpuid/v2",
			"github.com/psyche-go/psyche/trainer/modelspec"},
	}
	for dir, allowed := range allowedModules {
		out := goList(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./"+dir)
		for _, pkg := range strings.Fields(out) {
			if strings.HasPrefix(pkg, "github.com/psyche-go/psyche/"+dir) {
				continue
			}
			ok := false
			for _, a := range allowed {
				ok = ok || pkg == a || strings.HasPrefix(pkg, a+"/")
			}
			if !ok {
				t.Errorf("%s depends on %s", dir, pkg)
			}
		}
	}
}

// TestTestOnlyPackages: internal/soltest, internal/transcript and
// p2p/p2ptest (they fail tests through testing.TB) are imported by _test.go
// files only.
func TestTestOnlyPackages(t *testing.T) {
	root := repoRoot(t)
	testOnly := []string{"github.com/psyche-go/psyche/internal/soltest", "github.com/psyche-go/psyche/internal/transcript",
		"github.com/psyche-go/psyche/p2p/p2ptest"}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if contains(testOnly, p) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s imports %s, which only tests may use", rel, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func also(allowed []string) string {
	if len(allowed) == 0 {
		return ""
	}
	return " and " + strings.Join(allowed, ", ")
}

// wiring are the packages under trainer/ that choose the implementations:
// a trainer's libp2p network and node (trainer/start), and a whole local
// run on one machine (trainer/localrun).
var wiring = map[string]bool{
	"github.com/psyche-go/psyche/trainer/start":    true,
	"github.com/psyche-go/psyche/trainer/localrun": true,
}

// TestOnlyTheWiringKnowsLibp2p: the p2p contract and everything under
// trainer/ but the wiring (trainer/start, trainer/localrun) build without
// libp2p, so the trainer is tested against any p2p.Network and libp2p can
// change under it.
func TestOnlyTheWiringKnowsLibp2p(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found")
	}
	for _, pkg := range strings.Fields(goList(t, "./p2p", "./trainer/...")) {
		if wiring[pkg] {
			continue
		}
		for _, d := range strings.Fields(goList(t, "-deps", "-f", "{{.ImportPath}}", pkg)) {
			if strings.HasPrefix(d, "github.com/libp2p/") || d == "github.com/psyche-go/psyche/p2p/libp2p" {
				t.Errorf("%s depends on %s: only the wiring (trainer/start, trainer/localrun) may wire libp2p in", pkg, d)
				break
			}
		}
	}
}

// moduleImports lists, for every package of this module matching pattern
// (a go list pattern), its own imports from this module, both without the
// module's prefix: package → imports.
func moduleImports(t *testing.T, pattern string) map[string][]string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found")
	}
	const module = "github.com/psyche-go/psyche/"
	out := goList(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", pattern)
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		pkg := strings.TrimPrefix(fields[0], module)
		deps[pkg] = nil
		for _, imp := range fields[1:] {
			if dep, ok := strings.CutPrefix(imp, module); ok {
				deps[pkg] = append(deps[pkg], dep)
			}
		}
	}
	return deps
}

// TestInternalHoldsOnlyLeaves: a package under internal/ imports, of this
// module, only other internal/ packages and coordinator (the data model), so
// any layer may use it without pulling in another; a helper that needs more
// (the scale simulator drives the server and the trainer's machine) is a
// tool under tools/. (Its tests may import what they check against.)
func TestInternalHoldsOnlyLeaves(t *testing.T) {
	for pkg, deps := range moduleImports(t, "./internal/...") {
		for _, dep := range deps {
			if !strings.HasPrefix(dep, "internal/") && dep != "coordinator" {
				t.Errorf("%s imports %s: internal/ holds leaves (standard library, outside modules, internal/, coordinator); move what needs more to tools/ or its layer", pkg, dep)
			}
		}
	}
}

// layerRules: what a package under each folder may not import, of this
// module (docs/architecture.md, "The map"): the backends and the network
// know nothing of the trainer or of the programs built on them, and no
// library imports the CLI or the tools.
var layerRules = []struct {
	under     string
	forbidden []string
}{
	{"chain", []string{"trainer", "explorer", "federated", "cmd", "tools"}},
	{"p2p", []string{"chain", "trainer", "explorer", "federated", "cmd", "tools"}},
	{"programs", []string{"chain", "p2p", "trainer", "explorer", "federated", "cmd", "tools"}},
	{"trainer", []string{"explorer", "federated/fedserver", "cmd", "tools"}},
	{"federated", []string{"explorer", "cmd", "tools"}},
	{"explorer", []string{"federated", "cmd", "tools"}},
}

// TestLayersHold: no package imports upward (layerRules).
func TestLayersHold(t *testing.T) {
	for pkg, deps := range moduleImports(t, "./...") {
		for _, r := range layerRules {
			if pkg != r.under && !strings.HasPrefix(pkg, r.under+"/") {
				continue
			}
			for _, dep := range deps {
				for _, f := range r.forbidden {
					if dep == f || strings.HasPrefix(dep, f+"/") {
						t.Errorf("%s imports %s: %s/ may not import %s/ (docs/architecture.md, The map)", pkg, dep, r.under, f)
					}
				}
			}
		}
	}
}

// dependencyBans: packages that must not be compiled into another, however
// indirectly (its non-test dependencies): a part that only reads runs or
// only talks to a server stays small and builds without what it does not
// run (docs/architecture.md, The map).
var dependencyBans = []struct {
	pkg    string
	banned []string
	why    string
}{
	// The explorer reads what a run says about its model (trainer/modelspec);
	// it builds no model, so it compiles no model, kernel or engine (nor,
	// with -tags cuda, the CUDA bindings they bring).
	{"explorer", []string{"trainer/runmodel", "trainer/gpt", "trainer/llama", "trainer/kernels", "trainer/internal/lm", "trainer/engine"},
		"the explorer reads runs through trainer/modelspec and builds no model"},
	// The engine seam is a contract: models cross it as trainer/weights
	// (named tensors read a range at a time), so it compiles no model and no
	// kernel, and an engine that builds none (the torch engine's protocol,
	// a test's fake) need not either.
	{"trainer/engine", []string{"trainer/runmodel", "trainer/gpt", "trainer/llama", "trainer/kernels", "trainer/internal/lm"},
		"the engine contract hands models across as trainer/weights and builds none"},
	{"trainer/weights", []string{"trainer/runmodel", "trainer/gpt", "trainer/llama", "trainer/kernels", "trainer/internal/lm", "trainer/engine"},
		"weights are named tensors; building a model of them is trainer/runmodel's"},
	// The client speaks serverwire's formats; the server is another program.
	{"chain/serverclient", []string{"chain/server"}, "a program that only talks to a server does not compile one"},
	// The server answers clients; it never is one (its tests may use one).
	{"chain/server", []string{"chain/serverclient"}, "the server does not talk to servers"},
}

// TestDependencyBans: no package depends on what dependencyBans forbids it.
func TestDependencyBans(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found")
	}
	const module = "github.com/psyche-go/psyche/"
	for _, b := range dependencyBans {
		for _, dep := range strings.Fields(goList(t, "-deps", "-f", "{{.ImportPath}}", "./"+b.pkg)) {
			dep, ok := strings.CutPrefix(dep, module)
			if !ok {
				continue
			}
			for _, banned := range b.banned {
				if dep == banned || strings.HasPrefix(dep, banned+"/") {
					t.Errorf("%s depends on %s: %s", b.pkg, dep, b.why)
				}
			}
		}
	}
}

// TestGoListAnswersOnStdout: on a fresh module cache go list prints "go:
// downloading …" for each module it fetches, and the rules above must
// still read packages, not those words (read together with stdout, they
// were a package named "go:" that no rule allows). The fresh cache is
// filled from this machine's own through a file:// proxy: no network.
func TestGoListAnswersOnStdout(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found")
	}
	out, err := exec.Command("go", "env", "GOMODCACHE", "GOFLAGS").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	cache, flags, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	download := filepath.Join(cache, "cache", "download")
	if _, err := os.Stat(filepath.Join(download, "github.com", "bits-and-blooms", "bloom")); err != nil {
		t.Fatalf("the module cache %s has not downloaded coordinator's dependency (%v): build the module first", cache, err)
	}
	env := []string{"GOMODCACHE=" + t.TempDir(), "GOPROXY=file://" + filepath.ToSlash(download), "GOSUMDB=off",
		// writable module files, so that the test's temporary cache can
		// be removed; go.sum still checks every module's hash
		"GOFLAGS=" + strings.TrimSpace(flags+" -modcacherw")}
	stdout, stderr := goListEnv(t, env, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./coordinator")
	got := strings.Fields(stdout)
	slices.Sort(got)
	want := []string{"github.com/bits-and-blooms/bitset", "github.com/bits-and-blooms/bloom/v3", "github.com/psyche-go/psyche/coordinator"}
	if !slices.Equal(got, want) {
		t.Errorf("go list -deps ./coordinator read as %q, want %q", got, want)
	}
	if !strings.Contains(stderr, "go: downloading ") {
		t.Errorf("go list on an empty module cache reported no download (stderr %q): the case this test is for did not arise", stderr)
	}
}
