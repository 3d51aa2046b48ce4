package data

import (
	_ "embed"
	"fmt"
	"maps"
	"slices"
	"strings"
)

//go:embed corpus/opticks.txt
var opticks string

// Opticks returns a fresh copy of the text of Newton's Opticks (about 567 KB of
// UTF-8, public domain; see the package documentation), for demos and tests.
func Opticks() []byte { return []byte(opticks) }

// BuiltinPrefix starts a data location naming a corpus built into the
// trainer ("builtin:opticks"): every trainer has it, so a run can train with
// no token file to make and copy around.
const BuiltinPrefix = "builtin:"

// builtins are the corpora a builtin: location names, by name.
var builtins = map[string]func() []byte{"opticks": Opticks}

// Builtins lists the names of the built-in corpora, sorted.
func Builtins() []string { return slices.Sorted(maps.Keys(builtins)) }

// BuiltinText returns a fresh copy of the text of the built-in corpus name
// ("opticks", without the prefix), for a tokenizer other than the byte one.
func BuiltinText(name string) ([]byte, error) {
	text, ok := builtins[name]
	if !ok {
		return nil, fmt.Errorf("data: unknown built-in corpus %q: the built-in ones are %s", BuiltinPrefix+name,
			BuiltinPrefix+strings.Join(Builtins(), ", "+BuiltinPrefix))
	}
	return text(), nil
}

// openBuiltin returns the built-in corpus name tokenized with the byte
// tokenizer and encoded as tokenSize-byte tokens: exactly the bytes of the
// token file `psyche data tokenize` writes from the same text, built in
// memory (a few MB at most) each time it is opened.
func openBuiltin(name string, tokenSize int) (Source, error) {
	text, err := BuiltinText(name)
	if err != nil {
		return nil, err
	}
	b, err := EncodeTokens(nil, Tokenize(text), tokenSize)
	if err != nil {
		return nil, err
	}
	return &builtinSource{BytesSource: NewBytesSource(b), name: BuiltinPrefix + name}, nil
}

// builtinSource is a built-in corpus's tokens, named as its location.
type builtinSource struct {
	*BytesSource
	name string
}

// String names the source in errors and logs.
func (s *builtinSource) String() string { return s.name }
