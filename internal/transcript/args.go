package transcript

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Args are one command line of a transcript: the command, then words that
// are key=value pairs or positional. They record what the harness read, so
// that Run can fail on a key no harness code looked at.
type Args struct {
	Cmd     string
	pos     []string
	kv      map[string]string
	keys    []string // in the line's order
	read    map[string]bool
	posRead bool
}

// ParseArgs splits a command line at white space.
func ParseArgs(line string) *Args {
	f := strings.Fields(line)
	a := &Args{kv: map[string]string{}, read: map[string]bool{}}
	if len(f) == 0 {
		return a
	}
	a.Cmd = f[0]
	for _, w := range f[1:] {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			a.pos = append(a.pos, w)
			continue
		}
		if _, dup := a.kv[k]; !dup {
			a.keys = append(a.keys, k)
		}
		a.kv[k] = v
	}
	return a
}

// Pos returns the positional words, in order.
func (a *Args) Pos() []string {
	a.posRead = true
	return a.pos
}

// Lookup returns key's value and whether the line has it.
func (a *Args) Lookup(key string) (string, bool) {
	a.read[key] = true
	v, ok := a.kv[key]
	return v, ok
}

// Get returns key's value, "" when the line lacks it.
func (a *Args) Get(key string) string {
	v, _ := a.Lookup(key)
	return v
}

// GetOr returns key's value, def when the line lacks it.
func (a *Args) GetOr(key, def string) string {
	if v, ok := a.Lookup(key); ok {
		return v
	}
	return def
}

// Uint returns key's value as a decimal number, def when the line lacks it;
// a value that is not one fails the test.
func (a *Args) Uint(t testing.TB, key string, def uint64) uint64 {
	v, ok := a.Lookup(key)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", a.Cmd, key, v, err)
	}
	return n
}

// Keys returns every key of the line, in order, counting them all as read:
// for a command whose keys are open-ended (and checked by the harness).
func (a *Args) Keys() []string {
	for _, k := range a.keys {
		a.read[k] = true
	}
	return a.keys
}

// Unread lists the keys the harness never looked up and, when it never
// asked for them, the positional words.
func (a *Args) Unread() []string {
	var out []string
	for _, k := range a.keys {
		if !a.read[k] {
			out = append(out, k)
		}
	}
	if !a.posRead {
		out = append(out, a.pos...)
	}
	return slices.Clip(out)
}
