package data

import _ "embed"

//go:embed corpus/opticks.txt
var opticks string

// Opticks returns a fresh copy of the text of Newton's Opticks (about 567 KB of
// UTF-8, public domain; see the package documentation), for demos and tests.
func Opticks() []byte { return []byte(opticks) }
