package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// maxJSONDepth bounds how deeply a tokenizer.json nests (real ones: under
// 10), so that the walk's state stays small whatever the file holds.
const maxJSONDepth = 64

// precheck walks the JSON of a tokenizer.json once, keeping nothing, and
// refuses it at the first count past a limit: more entries in model.vocab
// than MaxVocabSize, in model.merges than MaxMerges, in added_tokens than
// MaxAddedTokens. decodeFile's full decode holds every entry at once (a
// 250 MiB list of merges took more than 3.5 GB before its count was
// checked); this walk costs a few bytes of state per nesting level, so a
// hostile file is refused before it is decoded. Syntax errors are left to
// the decoder, which reports them with their offsets.
func precheck(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	// path is the chain of object keys to the value being read ("" for an
	// array element).
	var path []string
	limits := map[string]struct {
		field string
		max   int
		what  string
	}{
		"model.vocab":  {"model.vocab", MaxVocabSize, "tokens"},
		"model.merges": {"model.merges", MaxMerges, "merges"},
		"added_tokens": {"added_tokens", MaxAddedTokens, "tokens"},
	}
	type frame struct {
		object  bool
		key     bool // an object expects a key next
		counted string
		n       int
	}
	var stack []frame
	// counting counts a value that starts in its container, and refuses
	// the file once a counted container holds more than its limit.
	counting := func() error {
		if len(stack) == 0 {
			return nil
		}
		top := &stack[len(stack)-1]
		if top.counted == "" {
			return nil
		}
		top.n++
		if l := limits[top.counted]; top.n > l.max {
			return fieldError(ErrTooLarge, l.field, "more than %d %s, the limit", l.max, l.what)
		}
		return nil
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return nil // the decoder reports it
		}
		if k, isKey := tok.(string); isKey && len(stack) > 0 && stack[len(stack)-1].object && stack[len(stack)-1].key {
			// An object key: the value after it is at path + key.
			stack[len(stack)-1].key = false
			if len(path) > 0 {
				path[len(path)-1] = k
			}
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if err := counting(); err != nil {
				return err
			}
			name := ""
			if len(stack) > 0 && stack[len(stack)-1].object && len(path) > 0 {
				name = joinPath(path)
			}
			if len(stack) == maxJSONDepth {
				return fmt.Errorf("%w: nested deeper than %d", ErrMalformed, maxJSONDepth)
			}
			f := frame{object: tok == json.Delim('{'), key: tok == json.Delim('{')}
			if _, ok := limits[name]; ok {
				f.counted = name
			}
			stack = append(stack, f)
			path = append(path, "")
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			path = path[:len(path)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].key = true
			}
		default:
			if err := counting(); err != nil {
				return err
			}
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].key = true
			}
		}
	}
}

// joinPath names a value by its object keys, "model.vocab".
func joinPath(p []string) string { return strings.Join(p, ".") }
